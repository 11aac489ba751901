"""The backend profiles: what QNN's rms_norm takes, and how a norm is fitted to it."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from tests.core.rule_checks import assert_left, assert_matches_eager, sample
from tests.forms import EPS, GemmaNorm, LlamaNorm
from tests.harness import DIM_ORDER_MODES, MODES, cast_path, norm_input, rewrite, rms_norm_nodes


# Backend profiles.


class TwoTrailingDims(nn.Module):
    """A norm over the last two dims, [5, 16], with a weight of that shape."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(5, 16, generator=torch.Generator().manual_seed(0)) + 0.5)

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean((-2, -1), keepdim=True) + EPS))


@pytest.mark.parametrize("mode", MODES)
def test_qnn_takes_a_norm_over_the_last_dim_only(mode):
    # QNN's released op builder normalizes over the last dim whatever normalized_shape says (or drops
    # the node): a norm over [5, 16] stays for qnn, and is rebuilt as one for aten.
    module, inputs = TwoTrailingDims(), (sample(),)
    assert_left(rewrite(module, inputs, mode, backend="qnn"), "qnn's rms_norm normalizes over the last dim only")
    rewritten = rewrite(module, inputs, mode, backend="aten")
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[1] == [5, 16] and cast_path(norm_input(node)) == ("x", ())  # reads x itself
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", ("edge", "edge-no-dim-order"))
def test_qnn_names_the_normalized_shape_before_the_dtype(mode):
    # A bfloat16 norm over [5, 16]: either would keep it for qnn; the shape is the reason that stays true
    # whatever the dtype.
    module = TwoTrailingDims().to(torch.bfloat16)
    rewritten = rewrite(module, (sample(torch.bfloat16),), mode, backend="qnn")
    assert_left(rewritten, "qnn's rms_norm normalizes over the last dim only")


@pytest.mark.parametrize("mode", ("edge", "edge-no-dim-order"))
def test_qnn_takes_no_bfloat16_outside_quantization_capture(mode):
    rewritten = rewrite(LlamaNorm().to(torch.bfloat16), (sample(torch.bfloat16),), mode, backend="qnn")
    assert_left(rewritten, "qnn has no bfloat16 rms_norm outside quantization capture")


@pytest.mark.parametrize("form", [LlamaNorm, T5Norm := __import__("tests.forms", fromlist=["T5Norm"]).T5Norm])
def test_qnn_takes_bfloat16_in_quantization_capture(form):
    module = form().to(torch.bfloat16)
    inputs = (sample(torch.bfloat16),)
    rewritten = rewrite(module, inputs, "capture", backend="qnn", quantization_capture=True)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ()) and node.args[2].op == "get_attr"
    assert_matches_eager(module, inputs, rewritten)


def test_quantization_capture_counts_type_as_as_a_cast():
    module = __import__("tests.forms", fromlist=["ExecuTorchLlamaNorm"]).ExecuTorchLlamaNorm().to(torch.bfloat16)
    inputs = (sample(torch.bfloat16),)
    rewritten = rewrite(module, inputs, "capture", backend="qnn", quantization_capture=True)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", MODES)
def test_qnn_folds_gemmas_one_plus_w_into_a_constant(mode):
    module = GemmaNorm()
    inputs = (sample(),)
    rewritten = rewrite(module, inputs, mode, backend="qnn")
    [node] = rms_norm_nodes(rewritten.graph_module)
    weight = node.args[2]
    assert weight.op in ("get_attr", "placeholder") and "rms_norm_weight" in weight.name
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_qnn_rebuilds_a_half_gemma_norm_in_float32_before_its_cast(mode):
    # Gemma applies its float32 (1 + w) in float32: QNN takes one dtype, so the norm is rebuilt in
    # float32 on the float32 upcast, with the folded float32 weight, and the cast back stays after it.
    module = GemmaNorm().to(torch.float16)
    inputs = (sample(torch.float16),)
    rewritten = rewrite(module, inputs, mode, backend="qnn")
    [decision] = rewritten.result.decisions
    assert decision.rebuilt and decision.dtype == torch.float32
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", (torch.float32,))
    assert node.args[2].meta["val"].dtype == torch.float32 and "rms_norm_weight" in node.args[2].name
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_qnn_takes_the_weight_in_the_norm_dtype_behind_a_cast(mode):
    module = __import__("tests.forms", fromlist=["Olmo2Norm"]).Olmo2Norm().to(torch.float16)
    inputs = (sample(torch.float16),)
    rewritten = rewrite(module, inputs, mode, backend="qnn")
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[2].meta["val"].dtype == torch.float16
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


class WeightTypeAs(nn.Module):
    """A float32 weight cast to the activation's dtype with ``type_as(x)``: x gives the dtype, no values."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight.type_as(x) * h.to(x.dtype)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_qnn_folds_a_weight_cast_with_type_as(mode):
    module = WeightTypeAs()
    inputs = (sample(torch.float16),)
    rewritten = rewrite(module, inputs, mode, backend="qnn")
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.meta["val"].dtype == torch.float16 and cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)
    # The folded weight is a constant outside autograd: one that required grad, as the parameter it was
    # cast from does, made torch warn on every call of the program.
    weight = node.args[2]
    program = rewritten.result.exported_program
    value = getattr(rewritten.graph_module, weight.target) if program is None else program.constants[weight.name]
    assert not value.requires_grad and value.dtype == torch.float16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rewritten.run(*inputs)
