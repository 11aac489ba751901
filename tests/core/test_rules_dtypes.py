"""Rule 7 of the recomposition, by name: one dtype D in and out, nothing below D or wider than rms_norm computes D in."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import edgefuse
from tests.core.rule_checks import assert_left, assert_matches_eager, sample
from tests.forms import EPS, LlamaNorm, RoundInsideNorm
from tests.harness import DIM_ORDER_MODES, MODES, cast_path, norm_input, exported, rewrite, rms_norm_nodes


# Rule 7: input and output share a dtype D, and everything the norm computes is D or wider, and no wider
# than the precision rms_norm computes D in.


class Float64Inside(nn.Module):
    """A norm computed in float64 between an upcast and a cast back to the model's dtype, then the weight."""

    def __init__(self, eps: float = EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(16) + 0.5)
        self.eps = eps

    def forward(self, x):
        h = x.double()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rule_a_norm_computed_wider_than_rms_norm_computes_stays(mode, dtype):
    # rms_norm computes a float32 (or bfloat16) norm in float32: rebuilt, squares of 1e20 would overflow
    # where the model's float64 squares do not, and every step would round to float32.
    module = Float64Inside().to(dtype)
    inputs = (sample(dtype) * 1e20,)
    assert_left(rewrite(module, inputs, mode), "computes in float64 inside a", "would add roundings")


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_a_float64_norm_is_rebuilt_in_float64(mode):
    # eps a float32 value: to_edge lifts a scalar eps into a float32 constant, so 1e-6 would already be
    # rounded in the unrewritten edge program
    module = Float64Inside(eps=2.0**-20).double()
    inputs = (sample(torch.float64),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.meta["val"].dtype == torch.float64
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_rounding_inside_the_norm_stays(mode):
    module = RoundInsideNorm()
    rewritten = rewrite(module, (sample(),), mode)
    assert_left(rewritten, "rounds to float16 inside a float32 norm")
    assert_matches_eager(module, (sample(),), rewritten, ulps=0)


class HalfRoundInsideNorm(nn.Module):
    """A ``dtype`` norm computed in float32 that rounds the normalized tensor to the other half dtype."""

    def __init__(self, inside: torch.dtype):
        super().__init__()
        self.inside = inside

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h.to(self.inside).to(x.dtype)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
@pytest.mark.parametrize(
    "dtype, inside", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)], ids=["f16-via-bf16", "bf16-via-f16"]
)
def test_rule_rounding_to_the_other_half_dtype_inside_the_norm_stays(mode, dtype, inside):
    """Neither half dtype holds the other's values: a rounding to it inside the norm is below D."""
    module, inputs = HalfRoundInsideNorm(inside), (sample(dtype),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)  # only the float32 norm before the rounding is rebuilt
    assert node.meta["val"].dtype == torch.float32
    assert cast_path(norm_input(node)) == ("x", (torch.float32,))
    assert not any(d.rebuilt and d.dtype == dtype for d in rewritten.result.decisions)
    assert_matches_eager(module, inputs, rewritten, dtype=dtype)


class UpcastThroughTheOtherHalfNorm(nn.Module):
    """A bfloat16 norm whose upcast goes through float16, which rounds bfloat16 values."""

    def forward(self, x):
        h = x.to(torch.float16).float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h.to(x.dtype)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_the_walk_back_never_passes_a_cast_between_half_dtypes(mode):
    module, inputs = UpcastThroughTheOtherHalfNorm(), (sample(torch.bfloat16),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)  # rebuilt in float32, on the float16-rounded copy
    assert node.meta["val"].dtype == torch.float32
    assert cast_path(norm_input(node)) == ("x", (torch.float16, torch.float32))
    assert_matches_eager(module, inputs, rewritten, dtype=torch.bfloat16)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_a_half_norm_with_a_float32_weight_stays(mode):
    module = LlamaNorm().to(torch.float16)
    module.weight.data = module.weight.data.float()
    rewritten = rewrite(module, (sample(torch.float16),), mode)
    assert_left(rewritten, "rounds to float16 inside a float32 norm")
    assert rewritten.run(sample(torch.float16)).dtype == torch.float32



@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_qnn_folds_a_narrower_weight_that_the_multiply_widens(mode):
    """A bfloat16 weight on a float32 norm: the multiply promotes it to float32 exactly, so the float32
    constant qnn takes holds the same values."""
    module = LlamaNorm()
    module.weight.data = module.weight.data.bfloat16()
    inputs = (sample(),)
    rewritten = rewrite(module, inputs, mode, backend="qnn")
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ()) and node.meta["val"].dtype == torch.float32
    assert node.args[2].meta["val"].dtype == torch.float32 and "rms_norm_weight" in node.args[2].name
    assert_matches_eager(module, inputs, rewritten, ulps=1.5)


class WeightInput(nn.Module):
    """A norm whose weight is an input of the model: known only when the program runs."""

    def forward(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


@pytest.mark.parametrize("mode", MODES)
def test_qnn_leaves_a_weight_that_is_a_model_input_and_says_so(mode):
    inputs = (sample(), torch.randn(16))
    assert_left(rewrite(WeightInput(), inputs, mode, backend="qnn"), "the weight w is an input of the model")
    rewritten = rewrite(WeightInput(), inputs, mode)  # aten takes any weight
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert_matches_eager(rewritten.module, inputs, rewritten)


def test_qnn_asks_for_the_program_when_a_lifted_graph_alone_cannot_tell_a_weight_from_an_input():
    program = torch.export.export(LlamaNorm(), (sample(),))  # its weight is a placeholder of program.graph_module
    result = edgefuse.recompose_rms_norm(program.graph_module, backend="qnn")
    assert "pass the ExportedProgram" in result.decisions[0].reason


class PlainNorm(nn.Module):
    """A norm with no casts, so a second one reads the first one's output itself."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


class TwoNormsInARow(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = PlainNorm(), PlainNorm()

    def forward(self, x):
        return self.second(self.first(x))


@pytest.mark.parametrize("mode", MODES)
def test_a_norm_reading_a_rebuilt_norm_names_its_input_as_the_graph_had_it(mode):
    inputs = (sample(),)
    before = exported(TwoNormsInARow(), inputs, mode)
    before = before if mode == "capture" else before.graph_module
    rewritten = rewrite(TwoNormsInARow(), inputs, mode, backend="qnn")
    first, second = rewritten.result.decisions
    assert first.rebuilt and second.rebuilt
    assert_matches_eager(rewritten.module, inputs, rewritten)
    # the second norm reads the first one's output: named as before the rewrite, not as the new rms_norm
    [first_output] = [n for n in before.graph.nodes if n.name == second.input]
    assert first_output.meta["nn_module_stack"] and "first" in list(first_output.meta["nn_module_stack"].values())[-1][0]
    assert second.input != first.node
