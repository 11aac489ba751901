"""Every form of RMSNorm is rebuilt on the right tensor in every dtype and mode, and matches eager."""

from __future__ import annotations

import pytest
import torch

from edgefuse.verify import compare_elementwise
from forms import (
    DivSqrtNorm,
    ExecuTorchLlamaNorm,
    FunctionalNorm,
    GemmaNorm,
    LlamaNorm,
    Olmo2Norm,
    ReciprocalSqrtNorm,
    RsqrtLeftNorm,
    ScalelessNorm,
    T5Norm,
)
from harness import DTYPES, MODES, cast_path, rewrite, rms_norm_nodes

FORMS = {
    "llama": LlamaNorm,
    "executorch-llama": ExecuTorchLlamaNorm,
    "t5": T5Norm,
    "olmo2": Olmo2Norm,
    "gemma": GemmaNorm,
    "no-weight": ScalelessNorm,
    "div-sqrt": DivSqrtNorm,
    "reciprocal-sqrt": ReciprocalSqrtNorm,
    "rsqrt-left": RsqrtLeftNorm,
}


def _inputs(dtype, shape=(2, 5, 16)):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(0)).mul(3).to(dtype),)


def assert_matches_eager(module, inputs, rewritten):
    """The rewritten program's output has eager's dtype and each element lies within two units in its last place."""
    expected = module(*inputs)
    actual = rewritten.run(*inputs)
    comparison = compare_elementwise(expected, actual)
    assert comparison.dtype_ok, (expected.dtype, actual.dtype)
    assert comparison.ok, f"max error {comparison.max_error} > {comparison.allowed} ({expected.dtype})"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
def test_every_form_is_rebuilt_on_its_input(form, dtype, mode):
    module = FORMS[form]().to(dtype)
    inputs = _inputs(dtype)
    rewritten = rewrite(module, inputs, mode)
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    [node] = rms_norm_nodes(rewritten.graph_module)
    # The new node reads the model's input itself, in the model's dtype: no cast before it.
    assert cast_path(node.args[0]) == ("x", ())
    assert node.args[1] == [16]
    # eps as the graph adds it: a Python float, a float32 constant, or one cast to the norm's dtype.
    assert node.args[3] in {float(torch.tensor(1e-6, dtype=d)) for d in (torch.float64, torch.float32, dtype)}
    assert node.meta["val"].dtype == dtype
    has_weight = form != "no-weight"
    assert (node.args[2] is not None) == has_weight
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", ("edge", "edge-no-dim-order"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_functional_rms_norm_decomposed_by_edge_is_rebuilt(dtype, mode):
    module = FunctionalNorm().to(dtype)
    inputs = _inputs(dtype)
    rewritten = rewrite(module, inputs, mode)
    assert [d.rebuilt for d in rewritten.result.decisions] == [True]
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(node.args[0]) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qk_norm_on_four_dims_is_rebuilt_over_the_head_dim(dtype, mode):
    module = LlamaNorm().to(dtype)
    inputs = _inputs(dtype, (2, 3, 4, 16))
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(node.args[0]) == ("x", ()) and node.args[1] == [16]
    assert_matches_eager(module, inputs, rewritten)
