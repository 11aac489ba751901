"""Rule 5 of the recomposition, by name: only dtype-only casts before the weight, of the normalized shape."""

from __future__ import annotations

import pytest
import torch

from tests.core.rule_checks import assert_left, assert_matches_eager, sample
from tests.forms import LaterMul, NormThenScale
from tests.harness import DIM_ORDER_MODES, cast_path, dtype_mode_cases, norm_input, rewrite, rms_norm_nodes


# Rule 5: only dtype-only casts between normalization and weight; the weight has the normalized shape.


@pytest.mark.parametrize("scale", [2.0, torch.tensor(2.0)], ids=["python-scalar", "0-d-constant"])
@pytest.mark.parametrize(("dtype", "mode"), dtype_mode_cases())
def test_rule_a_scalar_after_the_norm_is_never_the_weight(scale, mode, dtype):
    module = LaterMul(scale)
    inputs = (sample(dtype),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[2] is None  # the scale stays a multiply after the norm
    assert [u.name for u in node.users] and all("mul" in u.name for u in node.users)
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_a_weight_of_another_shape_is_not_the_weight(mode):
    module = LaterMul(torch.linspace(0.5, 2, 16).reshape(1, 16))
    inputs = (sample(torch.float16),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[2] is None
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize(("dtype", "mode"), dtype_mode_cases())
def test_rule_a_tensor_multiply_after_the_norm_stays_outside(mode, dtype):
    module = NormThenScale(scale_dtype=torch.float32).to(dtype)
    module.scale = module.scale.float()  # a float32 scale after a half norm, as in the released pass's bug
    inputs = (sample(dtype),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[2].name.endswith("weight")  # the norm's own weight, not the scale
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten, dtype=dtype)  # a float32 multiply follows the norm


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_a_half_norm_left_for_qnn_lends_no_weight_to_a_later_multiply(mode):
    module = NormThenScale().to(torch.bfloat16)
    module.scale = module.scale.float()
    rewritten = rewrite(module, (sample(torch.bfloat16),), mode, backend="qnn")
    assert_left(rewritten, "no bfloat16 rms_norm")
