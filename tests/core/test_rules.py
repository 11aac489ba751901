"""Each rule of the recomposition, tested by name: the case it protects stays right when it applies."""

from __future__ import annotations

import warnings

import pytest
import torch

import edgefuse

from edgefuse.verify import compare, compare_elementwise
from tests.forms import (
    ContiguousUpcastNorm,
    Cube,
    DifferentScaled,
    GemmaNorm,
    GroupedNorm,
    LaterMul,
    LlamaNorm,
    NoKeepdim,
    NormThenScale,
    ProductOfTwo,
    RoundInsideNorm,
    RoundThenNorm,
    WrongDim,
    EPS,
)
from tests.harness import MODES, cast_path, exported, norm_input, rewrite, rms_norm_nodes
from torch import nn


def _x(dtype=torch.float32, shape=(2, 5, 16), seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).mul(3).to(dtype)


def assert_matches_eager(module, inputs, rewritten, ulps=2.0, dtype=None):
    """Each element within ``ulps`` units in its last place in ``dtype`` (the norm's, when wider ops follow it)."""
    expected, actual = module(*inputs), rewritten.run(*inputs)
    comparison = compare_elementwise(expected, actual, ulps, dtype)
    assert comparison.dtype_ok and comparison.ok, (comparison, expected.dtype)


def assert_left(rewritten, *phrases):
    """No rms_norm was built, every candidate says why, the reason names the rule, and the program still
    computes exactly what eager does (left decomposed, nothing may change)."""
    assert phrases, "name the rule's reason"
    assert rms_norm_nodes(rewritten.graph_module) == []
    decisions = rewritten.result.decisions
    assert decisions and not any(d.rebuilt for d in decisions)
    reasons = " | ".join(d.reason for d in decisions)
    for phrase in phrases:
        assert phrase in reasons, reasons
    with torch.no_grad():
        expected, actual = rewritten.module(*rewritten.inputs), rewritten.run(*rewritten.inputs)
    for e, a in zip(*(x if isinstance(x, tuple) else (x,) for x in (expected, actual))):
        assert compare(e, a, ulps=0).ok, compare(e, a, ulps=0)


# Rule 1: the mean keeps its dims and reduces exactly the trailing dims.


@pytest.mark.parametrize("mode", MODES)
def test_rule_mean_over_a_leading_dim_stays(mode):
    module = WrongDim()
    rewritten = rewrite(module, (_x(),), mode)
    assert_left(rewritten, "not the trailing dims")
    assert_matches_eager(module, (_x(),), rewritten, ulps=0)


@pytest.mark.parametrize("mode", MODES)
def test_rule_mean_without_keepdim_stays(mode):
    rewritten = rewrite(NoKeepdim(), (_x(),), mode)
    assert_left(rewritten, "keepdim=False")


class MeanWithDtype(nn.Module):
    """A mean given ``dtype=``: the input's own (nothing is cast) or another one."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True, dtype=self.dtype) + EPS)


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_mean_given_its_inputs_own_dtype_is_rebuilt_and_one_that_casts_stays(mode):
    module = MeanWithDtype(torch.float32)
    rewritten = rewrite(module, (_x(),), mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert_matches_eager(module, (_x(),), rewritten)
    half = (_x(torch.float16),)
    assert_left(rewrite(MeanWithDtype(torch.float32), half, mode), "the mean casts to float32 while it reduces float16")


class ZeroDimNorm(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=[], keepdim=True) + EPS)


def test_rule_a_norm_of_a_0d_tensor_stays_and_says_why():
    assert_left(rewrite(ZeroDimNorm(), (torch.tensor(3.0),), "capture"), "the mean reads a 0-d tensor")


# Rule 2: the square is pow(x, 2), square(x) or x * x of one tensor.


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_cube_stays(mode):
    rewritten = rewrite(Cube(), (_x(),), mode)
    assert_left(rewritten, "pow(x, 3)")


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_product_of_two_tensors_stays(mode):
    inputs = (_x(), _x(seed=1))
    rewritten = rewrite(ProductOfTwo(), inputs, mode)
    assert_left(rewritten, "product of two different tensors")


class SquareOfTwoCasts(nn.Module):
    """``x.to(D) * x.to(D)``: two cast nodes of one tensor, so one tensor's square; ``other`` casts ``y``
    for the second factor, a product of two tensors."""

    def __init__(self, dtype: torch.dtype, other: bool = False):
        super().__init__()
        self.dtype, self.other = dtype, other

    def forward(self, x, y):
        h = x.to(self.dtype)
        second = (y if self.other else x).to(self.dtype)
        return h * torch.rsqrt((x.to(self.dtype) * second).mean(-1, keepdim=True) + EPS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source, dtype", [(torch.float64, torch.float32), (torch.float32, torch.float16)], ids=str)
def test_rule_a_square_of_two_casts_of_one_tensor_is_rebuilt_and_of_two_tensors_stays(mode, source, dtype):
    inputs = (_x(source), _x(source, seed=1))
    module = SquareOfTwoCasts(dtype)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", (dtype,)) and node.meta["val"].dtype == dtype  # reads x cast to D
    # A float32 norm rounds once more than rms_norm (1.5 units); one computed step by step in float16
    # is held to 4, as tests/core/test_forms.py derives for such forms.
    assert_matches_eager(module, inputs, rewritten, ulps=1.5 if dtype == torch.float32 else 4.0)
    assert_left(rewrite(SquareOfTwoCasts(dtype, other=True), inputs, mode), "product of two different tensors")


class CastsThatDiffer(nn.Module):
    """``a * b`` of two casts of one tensor that need not hold the same values, scaling ``a``."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, x):
        if self.how == "bfloat16 and float16":
            a, b = x.bfloat16(), x.half()
        elif self.how == "dim order":
            a, b = x.to(torch.float16, memory_format=torch.contiguous_format), x.half()
        elif self.how == "written between":  # the casts read h before and after an add through a view
            h = x.clone()
            a = h.half()
            h.view(-1).add_(1.0)
            b = h.half()
        else:  # "written through a view": the casts read a view of h, and the add writes h
            h = x.clone()
            v = h.view(x.shape)
            a = v.half()
            h.add_(1.0)
            b = v.half()
        return a * torch.rsqrt((a * b).mean(-1, keepdim=True) + EPS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how, reason", [
    ("bfloat16 and float16", "a product of casts of x to bfloat16 and to float16"),
    ("dim order", "a product of two casts of x that change more than its dtype"),
    ("written between", "a product of two casts of clone, which the graph writes in place"),
    ("written through a view", "a product of two casts of view, which the graph writes in place"),
])
def test_rule_two_casts_that_may_differ_are_no_square(mode, how, reason):
    x = _x(shape=(2, 3, 4, 16))
    if how == "dim order":
        x = x.contiguous(memory_format=torch.channels_last)
    if mode != "capture" and how != "dim order":
        # edge graphs promote the two factors to float32 first, and are functional: b casts the sum
        reason = "a product of two different tensors"
    assert_left(rewrite(CastsThatDiffer(how), (x,), mode), reason)


# Rule 3: the scaled tensor holds the squared tensor's values.


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_different_scaled_tensor_stays(mode):
    inputs = (_x(), _x(seed=1))
    module = DifferentScaled()
    rewritten = rewrite(module, inputs, mode)
    assert_left(rewritten, "scales the tensor it squares")
    assert_matches_eager(module, inputs, rewritten, ulps=0)


# Rule 4: eps is a finite, non-negative constant.


class EpsNorm(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


@pytest.mark.parametrize("eps", [float("nan"), float("inf"), -1e-3])
@pytest.mark.parametrize("mode", MODES)
def test_rule_eps_must_be_finite_and_non_negative(eps, mode):
    rewritten = rewrite(EpsNorm(eps), (_x(),), mode)
    assert_left(rewritten, "finite, non-negative eps")


class EpsInput(nn.Module):
    def forward(self, x, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("mode", MODES)
def test_rule_eps_from_a_graph_input_stays(mode):
    rewritten = rewrite(EpsInput(), (_x(), torch.tensor(1e-6)), mode)
    assert_left(rewritten, "eps is the graph input eps, an input of the model, not a constant")


@pytest.mark.parametrize("mode", MODES)
def test_rule_no_eps_is_eps_zero(mode):
    module = EpsNorm(0.0)
    rewritten = rewrite(module, (_x(),), mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[3] == 0.0
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, (_x(),), rewritten)


def _with_a_zero_row(dtype):
    x = _x(dtype)
    x[0, 0] = 0  # a padding row: its mean of squares is exactly 0
    return x


@pytest.mark.parametrize("mode", MODES)
def test_rule_an_eps_that_underflows_where_it_is_added_is_eps_zero(mode):
    """1e-12 is 0 in float16: the model's zero row is 0 * rsqrt(0) = NaN, and the rebuilt norm must agree."""
    module, inputs = EpsNorm(1e-12), (_with_a_zero_row(torch.float16),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[3] == 0.0
    assert cast_path(norm_input(node)) == ("x", ())
    [decision] = rewritten.result.decisions
    if mode == "capture":  # edge graphs lift eps into a float16 constant, already 0
        assert "1e-12 is 0 in float16" in decision.note
    assert torch.isnan(module(*inputs)[0, 0]).all()
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", MODES)
def test_rule_an_eps_that_fits_keeps_its_value_and_has_no_note(mode):
    module, inputs = EpsNorm(1e-12), (_with_a_zero_row(torch.float32),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    written = 1e-12 if mode == "capture" else torch.tensor(1e-12).item()  # edge lifts it into a float32 constant
    assert node.args[3] == written
    assert rewritten.result.decisions[0].note is None
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", MODES)
def test_rule_an_eps_that_overflows_where_it_is_added_stays(mode):
    """1e5 is inf in float16: every sum is inf and the model's norm is 0; rms_norm in float32 would not be."""
    module, inputs = EpsNorm(1e5), (_x(torch.float16),)
    rewritten = rewrite(module, inputs, mode)
    assert_left(rewritten, "overflows float16" if mode == "capture" else "eps is inf")  # edge lifts a float16 inf
    assert_matches_eager(module, inputs, rewritten, ulps=0)


class SharedEpsSum(nn.Module):
    """``mean + eps`` is also returned: the mean itself has one user, the sum two."""

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True) + EPS
        return x * torch.rsqrt(v), v


class CastFactor(nn.Module):
    """The factor is computed in float32 and rounded to the input's half dtype before it scales it."""

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS).to(x.dtype)


@pytest.mark.parametrize("mode", MODES)
def test_a_norm_left_for_its_shared_sum_or_its_cast_factor_names_that_node(mode):
    assert_left(rewrite(SharedEpsSum(), (_x(),), mode), "the mean of squares plus eps (", "is used by more than one node")
    assert_left(rewrite(CastFactor(), (_x(torch.float16),), mode), "the rsqrt is cast (")



@pytest.mark.parametrize("mode", MODES)
def test_a_cast_factor_that_changes_nothing_is_walked_past(mode):
    """In a float32 model, ``.to(x.dtype)`` of the rsqrt changes nothing; a captured graph still keeps it."""
    inputs = (_x(),)
    rewritten = rewrite(CastFactor(), inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ()) and node.args[2] is None
    assert_matches_eager(rewritten.module, inputs, rewritten, ulps=1.5)  # float32: one rounding more


class PowRoot(nn.Module):
    """``x * pow(mean + eps, exponent)``: a norm's root only by -0.5."""

    def __init__(self, exponent: float):
        super().__init__()
        self.exponent = exponent

    def forward(self, x):
        return x * torch.pow(x.pow(2).mean(-1, keepdim=True) + EPS, self.exponent)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("exponent, reason", [
    (-1.0, "follows the mean of squares, not rsqrt, sqrt, or pow by -0.5 or 0.5"),
    (-0.25, "follows the mean of squares, not rsqrt, sqrt, or pow by -0.5 or 0.5"),
    (0.5, "(a pow by 0.5) does not divide a tensor"),  # x * sqrt(m): no norm
])
def test_a_pow_is_a_root_only_by_minus_or_plus_one_half(mode, exponent, reason):
    assert_left(rewrite(PowRoot(exponent), (_x(),), mode), reason)

# Rule 5: only dtype-only casts between normalization and weight; the weight has the normalized shape.


@pytest.mark.parametrize("scale", [2.0, torch.tensor(2.0)], ids=["python-scalar", "0-d-constant"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_rule_a_scalar_after_the_norm_is_never_the_weight(scale, mode, dtype):
    module = LaterMul(scale)
    inputs = (_x(dtype),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[2] is None  # the scale stays a multiply after the norm
    assert [u.name for u in node.users] and all("mul" in u.name for u in node.users)
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_weight_of_another_shape_is_not_the_weight(mode):
    module = LaterMul(torch.linspace(0.5, 2, 16).reshape(1, 16))
    inputs = (_x(torch.float16),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[2] is None
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_rule_a_tensor_multiply_after_the_norm_stays_outside(mode, dtype):
    module = NormThenScale(scale_dtype=torch.float32).to(dtype)
    module.scale = module.scale.float()  # a float32 scale after a half norm, as in the released pass's bug
    inputs = (_x(dtype),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[2].name.endswith("weight")  # the norm's own weight, not the scale
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten, dtype=dtype)  # a float32 multiply follows the norm


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_half_norm_left_for_qnn_lends_no_weight_to_a_later_multiply(mode):
    module = NormThenScale().to(torch.bfloat16)
    module.scale = module.scale.float()
    rewritten = rewrite(module, (_x(torch.bfloat16),), mode, backend="qnn")
    assert_left(rewritten, "no bfloat16 rms_norm")


# Rule 6: the input is the nearest tensor of the output dtype, reached only past value-keeping casts.


@pytest.mark.parametrize("mode", MODES)
def test_rule_rounding_before_the_norm_is_kept(mode):
    module = RoundThenNorm()
    inputs = (_x(),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", (torch.float16, torch.float32))  # the rounded tensor
    assert_matches_eager(module, inputs, rewritten)


class NarrowBeforeNorm(nn.Module):
    """float16 in and out, but the input is rounded to bfloat16 before a float32 norm."""

    def __init__(self):
        super().__init__()
        self.norm = LlamaNorm()

    def forward(self, x):
        h = x.to(torch.bfloat16).to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.norm.weight.to(torch.float16) * h.to(torch.float16)


@pytest.mark.parametrize("mode", MODES)
def test_rule_the_walk_back_never_passes_a_narrowing_cast(mode):
    rewritten = rewrite(NarrowBeforeNorm(), (_x(torch.float16),), mode)
    assert_left(rewritten, "no tensor of the output dtype holds the input")


@pytest.mark.parametrize("mode", MODES)
def test_rule_the_walk_back_never_passes_a_dim_order_change(mode):
    module = ContiguousUpcastNorm().to(torch.float16)
    inputs = (_x(torch.float16, (2, 3, 4, 16)).to(memory_format=torch.channels_last),)
    rewritten = rewrite(module, inputs, mode)
    assert_left(rewritten, "no tensor of the output dtype holds the input")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_channels_last_input_with_a_cast_that_keeps_its_dim_order(mode, dtype):
    module = LlamaNorm().to(dtype)
    inputs = (_x(dtype, (2, 3, 4, 16)).to(memory_format=torch.channels_last),)
    rewritten = rewrite(module, inputs, mode)
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ())
    assert node.meta["val"].dim_order() == inputs[0].dim_order()
    assert_matches_eager(module, inputs, rewritten)


class LayoutCastBeforeWeight(nn.Module):
    """The cast between normalization and weight also makes the tensor contiguous."""

    def __init__(self):
        super().__init__()
        self.weight = LlamaNorm().weight

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(x.dtype, memory_format=torch.contiguous_format)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_rule_a_cast_that_changes_the_layout_never_joins_the_weight(mode, dtype):
    module = LayoutCastBeforeWeight().to(dtype)
    inputs = (_x(dtype, (2, 3, 4, 16)).to(memory_format=torch.channels_last),)
    rewritten = rewrite(module, inputs, mode)
    [decision] = rewritten.result.decisions
    assert decision.rebuilt and decision.weight is None and decision.dtype == torch.float32
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[2] is None
    assert cast_path(norm_input(node)) == ("x", () if dtype == torch.float32 else (torch.float32,))
    assert_matches_eager(module, inputs, rewritten)


class NoKeepdimBroadcasts(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1) + EPS)  # a [16] mean broadcast over the last dim


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_mean_without_keepdim_that_broadcasts_stays(mode):
    module, inputs = NoKeepdimBroadcasts(), (_x(shape=(16, 16)),)
    rewritten = rewrite(module, inputs, mode)
    assert_left(rewritten, "keepdim=False")
    assert_matches_eager(module, inputs, rewritten, ulps=0)


@pytest.mark.parametrize("mode", MODES)
def test_qnn_never_rounds_a_float32_weight_into_a_half_norm(mode):
    module = __import__("tests.forms", fromlist=["Olmo2Norm"]).Olmo2Norm().to(torch.float16)
    module.weight.data = module.weight.data.float()
    inputs = (_x(torch.float16),)
    rewritten = rewrite(module, inputs, mode, backend="qnn")
    [decision] = rewritten.result.decisions
    assert decision.rebuilt and decision.dtype == torch.float32
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.meta["val"].dtype == node.args[2].meta["val"].dtype == torch.float32
    assert cast_path(norm_input(node)) == ("x", (torch.float32,))
    assert_matches_eager(module, inputs, rewritten)


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


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rule_a_norm_computed_wider_than_rms_norm_computes_stays(mode, dtype):
    # rms_norm computes a float32 (or bfloat16) norm in float32: rebuilt, squares of 1e20 would overflow
    # where the model's float64 squares do not, and every step would round to float32.
    module = Float64Inside().to(dtype)
    inputs = (_x(dtype) * 1e20,)
    assert_left(rewrite(module, inputs, mode), "computes in float64 inside a", "would add roundings")


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_float64_norm_is_rebuilt_in_float64(mode):
    # eps a float32 value: to_edge lifts a scalar eps into a float32 constant, so 1e-6 would already be
    # rounded in the unrewritten edge program
    module = Float64Inside(eps=2.0**-20).double()
    inputs = (_x(torch.float64),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.meta["val"].dtype == torch.float64
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", MODES)
def test_rule_rounding_inside_the_norm_stays(mode):
    module = RoundInsideNorm()
    rewritten = rewrite(module, (_x(),), mode)
    assert_left(rewritten, "rounds to float16 inside a float32 norm")
    assert_matches_eager(module, (_x(),), rewritten, ulps=0)


class HalfRoundInsideNorm(nn.Module):
    """A ``dtype`` norm computed in float32 that rounds the normalized tensor to the other half dtype."""

    def __init__(self, inside: torch.dtype):
        super().__init__()
        self.inside = inside

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h.to(self.inside).to(x.dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "dtype, inside", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)], ids=["f16-via-bf16", "bf16-via-f16"]
)
def test_rule_rounding_to_the_other_half_dtype_inside_the_norm_stays(mode, dtype, inside):
    """Neither half dtype holds the other's values: a rounding to it inside the norm is below D."""
    module, inputs = HalfRoundInsideNorm(inside), (_x(dtype),)
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


@pytest.mark.parametrize("mode", MODES)
def test_rule_the_walk_back_never_passes_a_cast_between_half_dtypes(mode):
    module, inputs = UpcastThroughTheOtherHalfNorm(), (_x(torch.bfloat16),)
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)  # rebuilt in float32, on the float16-rounded copy
    assert node.meta["val"].dtype == torch.float32
    assert cast_path(norm_input(node)) == ("x", (torch.float16, torch.float32))
    assert_matches_eager(module, inputs, rewritten, dtype=torch.bfloat16)


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_half_norm_with_a_float32_weight_stays(mode):
    module = LlamaNorm().to(torch.float16)
    module.weight.data = module.weight.data.float()
    rewritten = rewrite(module, (_x(torch.float16),), mode)
    assert_left(rewritten, "rounds to float16 inside a float32 norm")
    assert rewritten.run(_x(torch.float16)).dtype == torch.float32



@pytest.mark.parametrize("mode", MODES)
def test_qnn_folds_a_narrower_weight_that_the_multiply_widens(mode):
    """A bfloat16 weight on a float32 norm: the multiply promotes it to float32 exactly, so the float32
    constant qnn takes holds the same values."""
    module = LlamaNorm()
    module.weight.data = module.weight.data.bfloat16()
    inputs = (_x(),)
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
    inputs = (_x(), torch.randn(16))
    assert_left(rewrite(WeightInput(), inputs, mode, backend="qnn"), "the weight w is an input of the model")
    rewritten = rewrite(WeightInput(), inputs, mode)  # aten takes any weight
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert_matches_eager(rewritten.module, inputs, rewritten)


def test_qnn_asks_for_the_program_when_a_lifted_graph_alone_cannot_tell_a_weight_from_an_input():
    program = torch.export.export(LlamaNorm(), (_x(),))  # its weight is a placeholder of program.graph_module
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
    inputs = (_x(),)
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


# Rule 8: a grouped norm is rebuilt over one group, reading the split tensor, never over the full width.


def _assert_rebuilt_over_groups(rewritten, split_shape, dtype):
    """One rms_norm over the last dim of the split tensor, ending before the merge, with no weight."""
    [node] = rms_norm_nodes(rewritten.graph_module)
    [decision] = rewritten.result.decisions
    assert decision.rebuilt and decision.form == "grouped-rsqrt", decision
    assert tuple(node.args[1]) == decision.normalized_shape == split_shape[-1:]
    assert decision.weight is None and node.args[2] is None  # what follows the merge stays as it is
    read = node.args[0].meta["val"]
    assert tuple(read.shape) == split_shape and read.dtype == dtype, read


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_rule_a_grouped_norm_is_rebuilt_over_one_group(mode, dtype):
    # 4 groups of 4 values of a width of 16, computed in float32, merged back, then a full-width weight
    module, inputs = GroupedNorm().to(dtype), (_x(dtype),)
    rewritten = rewrite(module, inputs, mode)
    # the new node reads the float32 copy of x split into groups, [2, 5, 4, 4]
    _assert_rebuilt_over_groups(rewritten, (2, 5, 4, 4), torch.float32)
    # elementwise against eager, at the 1.5 units tests/core/test_forms.py derives for a norm computed in
    # float32 (one rounding more or less); a norm over the full width is far off on every group
    assert_matches_eager(module, inputs, rewritten, ulps=1.5)


class UnflattenedGroups(nn.Module):
    """Groups split with ``unflatten`` and merged with ``flatten``, which capture keeps as they are."""

    def forward(self, x):
        h = x.unflatten(-1, (4, 4))
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).flatten(-2)


@pytest.mark.parametrize("mode", MODES)
def test_a_grouped_norm_split_by_unflatten_is_labelled_grouped(mode):
    module, inputs = UnflattenedGroups(), (_x(),)
    rewritten = rewrite(module, inputs, mode)
    _assert_rebuilt_over_groups(rewritten, (2, 5, 4, 4), torch.float32)
    assert_matches_eager(module, inputs, rewritten, ulps=1.5)  # as above


class HeadsMerged(nn.Module):
    """Groups normalized and merged back with no weight after them; ``two uses`` also returns the merge."""

    def __init__(self, after: str = "nothing"):
        super().__init__()
        self.after = after

    def forward(self, x):
        *lead, width = x.shape
        h = x.view(*lead, 4, width // 4)
        merged = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).view(*lead, width)
        if self.after == "two uses":
            return merged, merged * 2
        return merged * 2.0 if self.after == "a scalar" else merged


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("after", ["nothing", "two uses", "a scalar"])
def test_rule_a_grouped_norm_with_no_weight_is_rebuilt_over_one_group(mode, after):
    module, inputs = HeadsMerged(after), (_x(),)
    rewritten = rewrite(module, inputs, mode)
    _assert_rebuilt_over_groups(rewritten, (2, 5, 4, 4), torch.float32)  # x split into groups
    expected, actual = module(*inputs), rewritten.run(*inputs)
    for e, a in zip(*(v if isinstance(v, tuple) else (v,) for v in (expected, actual))):
        assert compare_elementwise(e, a, 1.5).ok, compare_elementwise(e, a, 1.5)  # as above


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
    module, inputs = TwoTrailingDims(), (_x(),)
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
    rewritten = rewrite(module, (_x(torch.bfloat16),), mode, backend="qnn")
    assert_left(rewritten, "qnn's rms_norm normalizes over the last dim only")


@pytest.mark.parametrize("mode", ("edge", "edge-no-dim-order"))
def test_qnn_takes_no_bfloat16_outside_quantization_capture(mode):
    rewritten = rewrite(LlamaNorm().to(torch.bfloat16), (_x(torch.bfloat16),), mode, backend="qnn")
    assert_left(rewritten, "qnn has no bfloat16 rms_norm outside quantization capture")


@pytest.mark.parametrize("form", [LlamaNorm, T5Norm := __import__("tests.forms", fromlist=["T5Norm"]).T5Norm])
def test_qnn_takes_bfloat16_in_quantization_capture(form):
    module = form().to(torch.bfloat16)
    inputs = (_x(torch.bfloat16),)
    rewritten = rewrite(module, inputs, "capture", backend="qnn", quantization_capture=True)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ()) and node.args[2].op == "get_attr"
    assert_matches_eager(module, inputs, rewritten)


def test_quantization_capture_counts_type_as_as_a_cast():
    module = __import__("tests.forms", fromlist=["ExecuTorchLlamaNorm"]).ExecuTorchLlamaNorm().to(torch.bfloat16)
    inputs = (_x(torch.bfloat16),)
    rewritten = rewrite(module, inputs, "capture", backend="qnn", quantization_capture=True)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", MODES)
def test_qnn_folds_gemmas_one_plus_w_into_a_constant(mode):
    module = GemmaNorm()
    inputs = (_x(),)
    rewritten = rewrite(module, inputs, mode, backend="qnn")
    [node] = rms_norm_nodes(rewritten.graph_module)
    weight = node.args[2]
    assert weight.op in ("get_attr", "placeholder") and "rms_norm_weight" in weight.name
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", MODES)
def test_qnn_rebuilds_a_half_gemma_norm_in_float32_before_its_cast(mode):
    # Gemma applies its float32 (1 + w) in float32: QNN takes one dtype, so the norm is rebuilt in
    # float32 on the float32 upcast, with the folded float32 weight, and the cast back stays after it.
    module = GemmaNorm().to(torch.float16)
    inputs = (_x(torch.float16),)
    rewritten = rewrite(module, inputs, mode, backend="qnn")
    [decision] = rewritten.result.decisions
    assert decision.rebuilt and decision.dtype == torch.float32
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", (torch.float32,))
    assert node.args[2].meta["val"].dtype == torch.float32 and "rms_norm_weight" in node.args[2].name
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", MODES)
def test_qnn_takes_the_weight_in_the_norm_dtype_behind_a_cast(mode):
    module = __import__("tests.forms", fromlist=["Olmo2Norm"]).Olmo2Norm().to(torch.float16)
    inputs = (_x(torch.float16),)
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


@pytest.mark.parametrize("mode", MODES)
def test_qnn_folds_a_weight_cast_with_type_as(mode):
    module = WeightTypeAs()
    inputs = (_x(torch.float16),)
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


class ScaledEpsNorm(nn.Module):
    """``mean + alpha * eps`` through ``aten.add.Scalar``, whose alpha is positional."""

    def forward(self, x):
        return x * torch.rsqrt(torch.ops.aten.add.Scalar(x.pow(2).mean(-1, keepdim=True), 0.5, 4))


@pytest.mark.parametrize("mode", MODES)
def test_rule_eps_scaled_by_a_positional_alpha_stays(mode):
    module = ScaledEpsNorm()
    rewritten = rewrite(module, (_x(),), mode)
    assert_left(rewritten, "alpha")
    assert_matches_eager(module, (_x(),), rewritten, ulps=0)


class StatefulEpsNorm(nn.Module):
    """eps is a buffer the model updates on every call: state, not a constant to fold."""

    def __init__(self):
        super().__init__()
        self.register_buffer("eps", torch.tensor(1.0))

    def forward(self, x):
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        self.eps.add_(1.0)
        return out


@pytest.mark.parametrize("mode", ("edge", "edge-no-dim-order"))
def test_rule_a_buffer_the_model_mutates_is_never_folded_into_eps(mode):
    rewritten = rewrite(StatefulEpsNorm(), (_x(),), mode)
    assert_left(rewritten, "not a constant")
    reference = StatefulEpsNorm()
    reference(_x())  # the program has run once, in assert_left
    for _ in range(3):  # the buffer grows on every call: eps must follow it
        assert compare(reference(_x()), rewritten.run(_x()), ulps=0).ok


class SharedRsqrtNorm(nn.Module):
    """The inverse root is also an output: a rebuilt norm would have to compute it twice."""

    def forward(self, x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * r, r


@pytest.mark.parametrize("mode", MODES)
def test_a_shared_inverse_root_stays_and_says_so(mode):
    module, inputs = SharedRsqrtNorm(), (_x(),)
    rewritten = rewrite(module, inputs, mode)
    assert_left(rewritten, "is used by 2 nodes")
    for expected, actual in zip(module(*inputs), rewritten.run(*inputs)):
        assert compare(expected, actual, ulps=0).ok


class TransposedNorm(nn.Module):
    """A norm over a transposed view (Gemma3's q/k norms): the decomposed output keeps the transposed layout."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 2.0, 16))

    def forward(self, x):
        h = x.transpose(0, 1)
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_a_norm_whose_output_keeps_a_transposed_layout_stays_in_capture():
    """rms_norm returns a contiguous tensor: rebuilding would change the output's dim order."""
    module, inputs = TransposedNorm(), (_x(shape=(5, 2, 16)),)
    rewritten = rewrite(module, inputs, "capture")
    assert_left(rewritten, "dim order")


class NormInABranch(nn.Module):
    """A Llama norm in one branch of ``torch.cond`` and a top-level norm after it."""

    def __init__(self):
        super().__init__()
        self.inner = LlamaNorm(16)
        self.outer = LlamaNorm(16)

    def forward(self, x):
        y = torch.cond(x.sum() > 0, lambda t: self.inner(t), lambda t: t * 2.0, (x,))
        return self.outer(y)


class NormInAMap(nn.Module):
    """A Llama norm in the body of ``map``: the top level of its edge graph calls no edge op."""

    def __init__(self):
        super().__init__()
        self.inner = LlamaNorm(16)

    def forward(self, x):
        from torch._higher_order_ops.map import map as control_map

        return control_map(lambda t: self.inner(t), x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("module, op", [(NormInABranch, "cond"), (NormInAMap, "map")], ids=["cond", "map"])
def test_a_norm_inside_a_control_flow_subgraph_is_reported_and_left(module, op, mode):
    """The pass rewrites the top-level graph; a norm in a subgraph gets a decision that says so, with its
    names qualified by the subgraph's, whatever the top level holds. Both branches are run."""
    module, inputs = module(), (_x(),)
    rewritten = rewrite(module, inputs, mode)
    inner = [d for d in rewritten.result.decisions if "." in d.mean]
    assert [(d.rebuilt, d.form) for d in inner] == [(False, "rsqrt+weight")], rewritten.result.decisions
    (decision,) = inner
    assert f"which {op}" in decision.reason and "top-level graph only" in decision.reason, decision.reason
    prefix = decision.mean.split(".")[0] + "."
    assert decision.input.startswith(prefix) and decision.weight.startswith(prefix), decision
    assert len(rms_norm_nodes(rewritten.graph_module)) == (1 if isinstance(module, NormInABranch) else 0)
    for args in (inputs, (-inputs[0],)):
        with torch.no_grad():
            assert compare(module(*args), rewritten.run(*args), ulps=2).ok
