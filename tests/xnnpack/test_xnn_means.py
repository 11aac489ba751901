"""Means lowered by edgefuse.xnnpack: numerics in the released runtime and the serialized node types."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from torch import nn
from torch.export import Dim

from xnn_helpers import assert_matches, casts_outside, lower_and_run, means_outside

from edgefuse.xnnpack.mean_plan import PlanError, plan_mean
from edgefuse.xnnpack.policy import keep_portable


class Means(nn.Module):
    """One output per ``(dims, keepdim)``; ``dims`` None means ``x.mean(dim=[])`` (all dims)."""

    def __init__(self, cases):
        super().__init__()
        self.cases = list(cases)

    def forward(self, x):
        return tuple(x.mean(dim=list(d) if d is not None else [], keepdim=k) for d, k in self.cases)


def _x(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 2 + 0.5).to(dtype)


class RankMeans(nn.Module):
    """For each input (ranks 1 to 6): the last-dim mean with keepdim, and from rank 2 on, without it and
    the first-dim mean."""

    def forward(self, *xs):
        out = []
        for x in xs:
            out.append(x.mean(-1, keepdim=True))
            if x.dim() > 1:
                out += [x.mean(-1), x.mean(0, keepdim=True)]
        return tuple(out)


def test_ranks_1_to_6():
    shapes = [(3, 2, 4, 3, 2, 5)[-rank:] for rank in range(1, 7)]
    inputs = tuple(_x(*shape, seed=len(shape)) for shape in shapes)
    # single_row="delegate": a rank-1 mean has one row, which the default policy keeps portable in float32.
    result = lower_and_run(RankMeans(), inputs, single_row="delegate")
    assert_matches(result)
    assert means_outside(result) == []
    assert result.delegates == 1
    assert result.counts["XNNStaticTranspose"] == 0
    assert result.counts["XNNFullyConnected"] == 11  # the 11 last-dim means
    assert result.counts["XNNGlobalAvgPooling2d"] == 5  # the first-dim means: [1, d0, 1, rest]


def test_a_mean_to_a_0d_tensor_stays_portable_and_runs():
    result = lower_and_run(Means([((0,), False), (None, False)]), (_x(5),), single_row="delegate")
    assert_matches(result)
    assert means_outside(result) == ["aten.mean.dim", "aten.mean.dim"]


def test_every_dim_combination_of_a_4d_input_with_and_without_keepdim():
    subsets = [c for r in range(1, 5) for c in itertools.combinations(range(4), r)]
    signed = [tuple(d - 4 if i % 2 else d for i, d in enumerate(s)) for s in subsets]  # negative dims too
    unordered = [tuple(reversed(s)) for s in signed]
    cases = [(s, keepdim) for keepdim in (True, False) for s in unordered + [None]]
    result = lower_and_run(Means(cases), (_x(2, 3, 4, 5),), single_row="delegate")
    assert_matches(result)
    # Without keepdim, the two means over all four dims are 0-d, which the delegate cannot return.
    assert means_outside(result) == ["aten.mean.dim", "aten.mean.dim"]
    assert result.delegates == 1
    # Only [2, 3] with keepdim is stock's global average pooling, transposed to NHWC and back.
    assert result.counts["XNNStaticTranspose"] == 2


def test_float16_means_and_rmsnorm():
    class Norm16(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.rand(16, dtype=torch.float16) + 0.5)

        def forward(self, x):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * h.to(x.dtype), x.mean(1), x.mean((0, 2), keepdim=True)

    result = lower_and_run(Norm16(), (_x(2, 6, 16, dtype=torch.float16),))
    assert_matches(result)
    assert means_outside(result) == [] and casts_outside(result) == []
    assert result.delegates == 1
    assert result.counts["XNNConvert"] == 2  # the norm's upcast and downcast


def test_bfloat16_mean_runs_in_float32_between_converts():
    result = lower_and_run(Means([((-1,), True), ((1,), False)]), (_x(2, 6, 16, dtype=torch.bfloat16),),
                           enable_bf16=True)
    assert_matches(result)
    assert means_outside(result) == []
    assert result.counts["XNNConvert"] == 4


def test_bfloat16_mean_without_enable_bf16_stays_portable_and_runs():
    result = lower_and_run(Means([((-1,), True)]), (_x(2, 6, 16, dtype=torch.bfloat16),))
    assert_matches(result)
    assert means_outside(result) == ["aten.mean.dim"]


def test_dynamic_shapes_over_random_sizes():
    class Dyn(nn.Module):
        def forward(self, x):
            return x.mean(-1, keepdim=True), x.mean(1, keepdim=True), x.mean((1, 2))

    seq = Dim("seq", min=2, max=24)
    rng = random.Random(5)
    sizes = rng.sample(range(2, 25), 5)
    runs = [(_x(2, n, 8, seed=n),) for n in sizes]
    result = lower_and_run(Dyn(), (_x(2, 7, 8),), run_inputs=runs, dynamic_shapes=({1: seq},))
    assert_matches(result)
    assert means_outside(result) == []
    assert result.counts["XNNGlobalAvgPooling2d"] == 2  # the two means over the run-time dim
    assert result.counts["XNNFullyConnected"] == 1


def test_two_run_time_dims_that_need_a_reshape_stay_portable_and_run():
    class Dyn2(nn.Module):
        def forward(self, x):
            return x.mean(-1) * 2.0

    dims = {0: Dim("batch", min=1, max=4), 1: Dim("seq", min=2, max=16)}
    result = lower_and_run(Dyn2(), (_x(2, 5, 8),), run_inputs=[(_x(3, 9, 8),)], dynamic_shapes=(dims,))
    assert_matches(result)
    assert means_outside(result) == ["aten.mean.dim"]


def test_global_average_pooling_program_is_byte_identical_to_stock():
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return self.conv(x).mean([-1, -2], keepdim=True), x.mean([2, 3], keepdim=True)

    for dtype in (torch.float32, torch.float16):
        module = Head().to(dtype)
        x = _x(1, 3, 8, 8, dtype=dtype)
        ours = lower_and_run(module, (x,))
        stock = lower_and_run(module, (x,), stock=True)
        assert_matches(ours)
        assert ours.counts["XNNGlobalAvgPooling2d"] == 2
        assert ours.manager.to_executorch().buffer == stock.manager.to_executorch().buffer


class ConvMeanConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(1, 4, 3, padding=1)

    def forward(self, x):
        return self.b(self.a(x).mean(1, keepdim=True))


class ConvCentre(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        return y - y.mean(1, keepdim=True)


@pytest.mark.parametrize("module, transposes", [(ConvMeanConv, 4), (ConvCentre, 4)])
def test_convolution_then_channel_mean(module, transposes):
    result = lower_and_run(module(), (_x(1, 3, 6, 5),))
    assert_matches(result)
    assert means_outside(result) == []
    assert result.delegates == 1
    # The channel mean reads NCHW: reshape to [1, 8, 1, 30], pool, reshape back.
    assert result.counts["XNNGlobalAvgPooling2d"] == 1
    assert result.counts["XNNStaticTranspose"] == transposes


def test_channels_last_input():
    x = _x(2, 3, 4, 5).to(memory_format=torch.channels_last)
    result = lower_and_run(Means([((1,), True), ((-1,), True), ((1, 2), False)]), (x,))
    assert_matches(result)
    assert means_outside(result) == []
    assert result.counts["XNNStaticTranspose"] >= 1  # the input is copied to NCHW once, inside


def test_squares_pow_float_and_self_multiply():
    class Squares(nn.Module):
        def forward(self, x):
            return torch.pow(x, 2.0).mean(-1, keepdim=True) + (x * x).mean(-1, keepdim=True)

    result = lower_and_run(Squares(), (_x(4, 16),))
    assert_matches(result)
    assert result.outside == []
    assert result.counts["XNNSquare"] == 1 and result.counts["XNNMultiply"] == 1


def test_single_row_policy_decisions():
    assert keep_portable("float32-portable", 1, torch.float32)
    assert keep_portable("float32-portable", 1, torch.float16) is None
    assert keep_portable("float32-portable", 2, torch.float32) is None
    assert keep_portable("float32-portable", None, torch.float32) is None  # run-time rows: delegate
    assert keep_portable("portable", 1, torch.float16)
    assert keep_portable("delegate", 1, torch.float32) is None


def test_single_row_policy_in_lowered_programs():
    f32 = lower_and_run(Means([((-1,), True)]), (_x(1, 1, 32),))
    assert_matches(f32)
    assert means_outside(f32) == ["aten.mean.dim"]
    delegated = lower_and_run(Means([((-1,), True)]), (_x(1, 1, 32),), single_row="delegate")
    assert_matches(delegated)
    assert means_outside(delegated) == [] and delegated.counts["XNNFullyConnected"] == 1
    f16 = lower_and_run(Means([((-1,), True)]), (_x(1, 1, 32, dtype=torch.float16),))
    assert_matches(f16)
    assert means_outside(f16) == [] and f16.counts["XNNFullyConnected"] == 1


def test_plan_refuses_what_the_runtime_cannot_express():
    with pytest.raises(PlanError, match="at most one run-time dim"):
        plan_mean((None, None, 8), [-1], False, (4, 4, 8))
    with pytest.raises(PlanError, match="out of range"):
        plan_mean((2, 3), [2], True)
    with pytest.raises(PlanError, match="twice"):
        plan_mean((2, 3), [1, -1], True)


def test_bad_input_gets_a_clear_error():
    from edgefuse.xnnpack import EdgefuseXnnpackPartitioner, lower

    with pytest.raises(TypeError, match="torch.export.export"):
        lower(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="single_row policy"):
        EdgefuseXnnpackPartitioner(single_row="sometimes")
