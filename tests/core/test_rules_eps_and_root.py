"""Rule 4 of the recomposition, by name: eps, and the root it is added under."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.core.rule_checks import assert_left, assert_matches_eager, sample
from tests.forms import EPS
from tests.harness import DIM_ORDER_MODES, MODES, cast_path, norm_input, rewrite, rms_norm_nodes


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
    rewritten = rewrite(EpsNorm(eps), (sample(),), mode)
    assert_left(rewritten, "finite, non-negative eps")


class EpsInput(nn.Module):
    def forward(self, x, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("mode", MODES)
def test_rule_eps_from_a_graph_input_stays(mode):
    rewritten = rewrite(EpsInput(), (sample(), torch.tensor(1e-6)), mode)
    assert_left(rewritten, "eps is the graph input eps, an input of the model, not a constant")


@pytest.mark.parametrize("mode", MODES)
def test_rule_no_eps_is_eps_zero(mode):
    module = EpsNorm(0.0)
    rewritten = rewrite(module, (sample(),), mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[3] == 0.0
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, (sample(),), rewritten)


def _with_a_zero_row(dtype):
    x = sample(dtype)
    x[0, 0] = 0  # a padding row: its mean of squares is exactly 0
    return x


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
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


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_an_eps_that_overflows_where_it_is_added_stays(mode):
    """1e5 is inf in float16: every sum is inf and the model's norm is 0; rms_norm in float32 would not be."""
    module, inputs = EpsNorm(1e5), (sample(torch.float16),)
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


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_a_norm_left_for_its_shared_sum_or_its_cast_factor_names_that_node(mode):
    assert_left(rewrite(SharedEpsSum(), (sample(),), mode), "the mean of squares plus eps (", "is used by more than one node")
    assert_left(rewrite(CastFactor(), (sample(torch.float16),), mode), "the rsqrt is cast (")



@pytest.mark.parametrize("mode", MODES)
def test_a_cast_factor_that_changes_nothing_is_walked_past(mode):
    """In a float32 model, ``.to(x.dtype)`` of the rsqrt changes nothing; a captured graph still keeps it."""
    inputs = (sample(),)
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
    assert_left(rewrite(PowRoot(exponent), (sample(),), mode), reason)
