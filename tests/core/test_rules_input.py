"""Rule 6 of the recomposition, by name: the input, reached only past casts that keep every value."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.core.rule_checks import assert_left, assert_matches_eager, sample
from tests.forms import EPS, ContiguousUpcastNorm, LlamaNorm, RoundThenNorm
from tests.harness import DIM_ORDER_MODES, MODES, cast_path, norm_input, rewrite, rms_norm_nodes


# Rule 6: the input is the nearest tensor of the output dtype, reached only past value-keeping casts.


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_rounding_before_the_norm_is_kept(mode):
    module = RoundThenNorm()
    inputs = (sample(),)
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


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_the_walk_back_never_passes_a_narrowing_cast(mode):
    rewritten = rewrite(NarrowBeforeNorm(), (sample(torch.float16),), mode)
    assert_left(rewritten, "no tensor of the output dtype holds the input")


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_rule_the_walk_back_never_passes_a_dim_order_change(mode):
    module = ContiguousUpcastNorm().to(torch.float16)
    inputs = (sample(torch.float16, (2, 3, 4, 16)).to(memory_format=torch.channels_last),)
    rewritten = rewrite(module, inputs, mode)
    assert_left(rewritten, "no tensor of the output dtype holds the input")


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_channels_last_input_with_a_cast_that_keeps_its_dim_order(mode, dtype):
    module = LlamaNorm().to(dtype)
    inputs = (sample(dtype, (2, 3, 4, 16)).to(memory_format=torch.channels_last),)
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


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_rule_a_cast_that_changes_the_layout_never_joins_the_weight(mode, dtype):
    module = LayoutCastBeforeWeight().to(dtype)
    inputs = (sample(dtype, (2, 3, 4, 16)).to(memory_format=torch.channels_last),)
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
    module, inputs = NoKeepdimBroadcasts(), (sample(shape=(16, 16)),)
    rewritten = rewrite(module, inputs, mode)
    assert_left(rewritten, "keepdim=False")
    assert_matches_eager(module, inputs, rewritten, ulps=0)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_qnn_never_rounds_a_float32_weight_into_a_half_norm(mode):
    module = __import__("tests.forms", fromlist=["Olmo2Norm"]).Olmo2Norm().to(torch.float16)
    module.weight.data = module.weight.data.float()
    inputs = (sample(torch.float16),)
    rewritten = rewrite(module, inputs, mode, backend="qnn")
    [decision] = rewritten.result.decisions
    assert decision.rebuilt and decision.dtype == torch.float32
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.meta["val"].dtype == node.args[2].meta["val"].dtype == torch.float32
    assert cast_path(norm_input(node)) == ("x", (torch.float32,))
    assert_matches_eager(module, inputs, rewritten)
