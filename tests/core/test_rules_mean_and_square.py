"""Rules 1 to 3 of the recomposition, by name: the mean, the square, and the scaled tensor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.core.rule_checks import assert_left, assert_matches_eager, sample
from tests.forms import EPS, Cube, DifferentScaled, NoKeepdim, ProductOfTwo, WrongDim
from tests.harness import DIM_ORDER_MODES, MODES, cast_path, norm_input, rewrite, rms_norm_nodes


# Rule 1: the mean keeps its dims and reduces exactly the trailing dims.


@pytest.mark.parametrize("mode", MODES)
def test_rule_mean_over_a_leading_dim_stays(mode):
    module = WrongDim()
    rewritten = rewrite(module, (sample(),), mode)
    assert_left(rewritten, "not the trailing dims")
    assert_matches_eager(module, (sample(),), rewritten, ulps=0)


@pytest.mark.parametrize("mode", MODES)
def test_rule_mean_without_keepdim_stays(mode):
    rewritten = rewrite(NoKeepdim(), (sample(),), mode)
    assert_left(rewritten, "keepdim=False")


class MeanWithDtype(nn.Module):
    """A mean given ``dtype=``: the input's own (nothing is cast) or another one."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True, dtype=self.dtype) + EPS)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_a_mean_given_its_inputs_own_dtype_is_rebuilt_and_one_that_casts_stays(mode):
    module = MeanWithDtype(torch.float32)
    rewritten = rewrite(module, (sample(),), mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert_matches_eager(module, (sample(),), rewritten)
    half = (sample(torch.float16),)
    assert_left(rewrite(MeanWithDtype(torch.float32), half, mode), "the mean casts to float32 while it reduces float16")


class ZeroDimNorm(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=[], keepdim=True) + EPS)


def test_rule_a_norm_of_a_0d_tensor_stays_and_says_why():
    assert_left(rewrite(ZeroDimNorm(), (torch.tensor(3.0),), "capture"), "the mean reads a 0-d tensor")


# Rule 2: the square is pow(x, 2), square(x) or x * x of one tensor.


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_cube_stays(mode):
    rewritten = rewrite(Cube(), (sample(),), mode)
    assert_left(rewritten, "pow(x, 3)")


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_product_of_two_tensors_stays(mode):
    inputs = (sample(), sample(seed=1))
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


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
@pytest.mark.parametrize("source, dtype", [(torch.float64, torch.float32), (torch.float32, torch.float16)], ids=str)
def test_rule_a_square_of_two_casts_of_one_tensor_is_rebuilt_and_of_two_tensors_stays(mode, source, dtype):
    inputs = (sample(source), sample(source, seed=1))
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


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
@pytest.mark.parametrize("how, reason", [
    ("bfloat16 and float16", "a product of casts of x to bfloat16 and to float16"),
    ("dim order", "a product of two casts of x that change more than its dtype"),
    ("written between", "a product of two casts of clone, which the graph writes in place"),
    ("written through a view", "a product of two casts of view, which the graph writes in place"),
])
def test_rule_two_casts_that_may_differ_are_no_square(mode, how, reason):
    x = sample(shape=(2, 3, 4, 16))
    if how == "dim order":
        x = x.contiguous(memory_format=torch.channels_last)
    if mode != "capture" and how != "dim order":
        # edge graphs promote the two factors to float32 first, and are functional: b casts the sum
        reason = "a product of two different tensors"
    assert_left(rewrite(CastsThatDiffer(how), (x,), mode), reason)


# Rule 3: the scaled tensor holds the squared tensor's values.


@pytest.mark.parametrize("mode", MODES)
def test_rule_a_different_scaled_tensor_stays(mode):
    inputs = (sample(), sample(seed=1))
    module = DifferentScaled()
    rewritten = rewrite(module, inputs, mode)
    assert_left(rewritten, "scales the tensor it squares")
    assert_matches_eager(module, inputs, rewritten, ulps=0)
