"""Rule 8 of the recomposition, by name: a grouped norm is rebuilt over one group, never over the full width."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgefuse.core.verify import compare_elementwise
from tests.core.rule_checks import assert_matches_eager, sample
from tests.forms import EPS, GroupedNorm
from tests.harness import DIM_ORDER_MODES, MODES, dtype_mode_cases, rewrite, rms_norm_nodes


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


@pytest.mark.parametrize(("dtype", "mode"), dtype_mode_cases((torch.float32, torch.float16)))
def test_rule_a_grouped_norm_is_rebuilt_over_one_group(mode, dtype):
    # 4 groups of 4 values of a width of 16, computed in float32, merged back, then a full-width weight
    module, inputs = GroupedNorm().to(dtype), (sample(dtype),)
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
    module, inputs = UnflattenedGroups(), (sample(),)
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


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
@pytest.mark.parametrize("after", ["nothing", "two uses", "a scalar"])
def test_rule_a_grouped_norm_with_no_weight_is_rebuilt_over_one_group(mode, after):
    module, inputs = HeadsMerged(after), (sample(),)
    rewritten = rewrite(module, inputs, mode)
    _assert_rebuilt_over_groups(rewritten, (2, 5, 4, 4), torch.float32)  # x split into groups
    expected, actual = module(*inputs), rewritten.run(*inputs)
    for e, a in zip(*(v if isinstance(v, tuple) else (v,) for v in (expected, actual))):
        assert compare_elementwise(e, a, 1.5).ok, compare_elementwise(e, a, 1.5)  # as above
