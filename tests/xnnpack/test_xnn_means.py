"""Means lowered by edgefuse.xnnpack: numerics in the released runtime and the serialized node types."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from torch import nn
from torch.export import Dim, export

from tests.xnnpack.xnn_helpers import assert_matches, casts_outside, lower_and_run, means_outside

from edgefuse.core.verify import tolerance
from edgefuse.xnnpack.inspect import lowered_modules, xnn_graph
from edgefuse.xnnpack.mean_plan import PlanError, plan_mean
from edgefuse.xnnpack.policy import DEFAULT_SINGLE_ROW_POLICY, SINGLE_ROW_POLICIES, keep_portable

pytestmark = pytest.mark.slow


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
    # single_row="delegate" (the default, written out): a rank-1 mean has one row, which 'auto' and
    # 'float32-portable' would keep portable in float32.
    result = lower_and_run(RankMeans(), inputs, single_row="delegate")
    assert_matches(result)
    assert means_outside(result) == []
    assert result.delegates == 1
    assert result.counts["XNNStaticTranspose"] == 0
    assert result.counts["XNNFullyConnected"] == 11  # the 11 last-dim means
    assert result.counts["XNNGlobalAvgPooling2d"] == 5  # the first-dim means: [1, d0, 1, rest]


class PlainNorm(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_a_norm_over_7_dims_stays_outside_so_the_program_loads():
    # XNNPACK defines tensors of at most 6 dims: stock delegates the rank-7 pow and mul, and its program
    # fails to load; edgefuse's keeps every rank-7 op on the portable kernels.
    x = _x(1, 2, 1, 2, 1, 2, 16)
    result = lower_and_run(PlainNorm(), (x,))
    assert_matches(result)
    assert result.delegates == 0 and len(result.outside) == 5
    result = lower_and_run(PlainNorm(), (x[0],))  # rank 6: one delegate, nothing outside
    assert_matches(result)
    assert result.delegates == 1 and result.outside == []


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
    # the norm's upcast and downcast; x.mean((0, 2)) reduces its last dim by a float32 fully-connected
    assert result.counts["XNNConvert"] == 4 and result.counts["XNNFullyConnected"] == 2


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
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    assert DEFAULT_SINGLE_ROW_POLICY == "delegate"
    assert set(SINGLE_ROW_POLICIES) == {"auto", "delegate", "float32-portable", "portable"}
    # (rows, dtype, width) -> whether each policy keeps the mean portable.
    cases = {
        (1, f32, 4096): {"auto": False, "delegate": False, "float32-portable": True, "portable": True},
        (1, f32, 1024): {"auto": False, "delegate": False, "float32-portable": True, "portable": True},
        (1, f32, 1023): {"auto": True, "delegate": False, "float32-portable": True, "portable": True},
        (1, f32, 2050): {"auto": True, "delegate": False, "float32-portable": True, "portable": True},  # no lanes
        (1, f32, 512): {"auto": True, "delegate": False, "float32-portable": True, "portable": True},
        (1, f32, None): {"auto": True, "delegate": False, "float32-portable": True, "portable": True},
        (1, f16, 512): {"auto": False, "delegate": False, "float32-portable": False, "portable": True},
        (1, f16, 4096): {"auto": False, "delegate": False, "float32-portable": False, "portable": True},
        (1, bf16, 64): {"auto": False, "delegate": False, "float32-portable": False, "portable": True},
        (2, f32, 64): {"auto": False, "delegate": False, "float32-portable": False, "portable": False},
        (None, f32, 64): {"auto": False, "delegate": False, "float32-portable": False, "portable": False},
        (None, f32, None): {"auto": False, "delegate": False, "float32-portable": False, "portable": False},
    }
    for (rows, dtype, width), expected in cases.items():
        assert set(expected) == set(SINGLE_ROW_POLICIES)
        for policy, portable in expected.items():
            reason = keep_portable(policy, rows, dtype, width)
            assert bool(reason) == portable, (policy, rows, dtype, width, reason)
            if reason:
                assert repr(policy) in reason, reason  # the reason names the policy
    # Without a width (not static, or not given) 'auto' keeps a float32 single row portable.
    assert keep_portable("auto", 1, f32)
    assert "512 values" in keep_portable("auto", 1, f32, 512)
    assert "run-time number" in keep_portable("auto", 1, f32, None)


def test_single_row_policy_in_lowered_programs():
    f32 = lower_and_run(Means([((-1,), True)]), (_x(1, 1, 32),), single_row="float32-portable")
    assert_matches(f32)
    assert means_outside(f32) == ["aten.mean.dim"]
    delegated = lower_and_run(Means([((-1,), True)]), (_x(1, 1, 32),))  # the default: delegate
    assert_matches(delegated)
    assert means_outside(delegated) == [] and delegated.counts["XNNFullyConnected"] == 1
    f16 = lower_and_run(Means([((-1,), True)]), (_x(1, 1, 32, dtype=torch.float16),), single_row="float32-portable")
    assert_matches(f16)
    assert means_outside(f16) == [] and f16.counts["XNNFullyConnected"] == 1


class LastDimMeans(nn.Module):
    """``x.mean(-1, keepdim=True)`` of each input."""

    def forward(self, *xs):
        return tuple(x.mean(-1, keepdim=True) for x in xs)


def _value_dims(result) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """As serialized in the delegates: the input dims of every ``XNNGlobalAvgPooling2d``, the filter dims of
    every ``XNNFullyConnected``, and the ``new_shape`` of every ``XNNStaticReshape``."""
    pools, filters, reshapes = [], [], []
    for module in lowered_modules(result.manager):
        graph = xnn_graph(module.processed_bytes)
        dims = {v["xvalue_union"]["id_out"]: v["xvalue_union"]["dims"] for v in graph["xvalues"]}
        for node in graph.get("xnodes", []):
            kind, fields = node["xnode_union_type"], node["xnode_union"]
            if kind == "XNNGlobalAvgPooling2d":
                pools.append(dims[fields["input_id"]])
            elif kind == "XNNFullyConnected":
                filters.append(dims[fields["filter_id"]])
            elif kind == "XNNStaticReshape":
                reshapes.append(fields["new_shape"])
    return pools, filters, reshapes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_wide_last_dim_mean_is_averaged_in_lanes(dtype):
    # 32 rows of 2048: reshape to [32, 64, 1, 32], pool the 64 values of each of 32 lanes, then one
    # fully-connected of 32 inputs against a 1/32 row.
    result = lower_and_run(Means([((-1,), True), ((-1,), False)]), (_x(1, 32, 2048, dtype=dtype),))
    assert_matches(result)
    assert means_outside(result) == []
    assert result.delegates == 1
    assert result.counts["XNNGlobalAvgPooling2d"] == 2 and result.counts["XNNFullyConnected"] == 2
    assert result.counts["XNNStaticTranspose"] == 0
    pools, filters, _ = _value_dims(result)
    assert pools == [[32, 64, 1, 32]] * 2
    assert filters == [[1, 32]] * 2
    assert [s.kind for s in plan_mean((1, 32, 2048), [-1], True)] == [
        "reshape", "global_avg_pool", "reshape", "fully_connected", "reshape"
    ]


def test_a_float16_fully_connected_mean_runs_in_float32_and_keeps_nans():
    # XNNPACK's float16 fully-connected turns a NaN row into -inf, and a float16 1/W row is off by up to
    # half a float16 unit (far more once subnormal): the fully-connected runs in float32, converts around it.
    one_row, rows = _x(1, 37, dtype=torch.float16), _x(4, 37, dtype=torch.float16, seed=1)
    one_row[0, 3] = float("nan")
    rows[1, 5] = float("nan")
    rows[2, 0], rows[2, 1] = float("inf"), float("-inf")  # inf - inf: NaN too
    for x, kind in ((one_row, "fully_connected"), (rows, "fully_connected_rows")):
        result = lower_and_run(Means([((-1,), True)]), (x,), single_row="delegate")
        assert means_outside(result) == []
        assert [s.kind for s in plan_mean(tuple(x.shape), [-1], True)][0] == kind
        assert [t for t in result.types[0] if t != "XNNStaticReshape"] == [
            "XNNConvert", "XNNFullyConnected", "XNNConvert"
        ], result.types
        graph = xnn_graph(lowered_modules(result.manager)[0].processed_bytes)
        datatype = {v["xvalue_union"]["id_out"]: v["xvalue_union"]["datatype"] for v in graph["xvalues"]}
        (fc,) = [n["xnode_union"] for n in graph["xnodes"] if n["xnode_union_type"] == "XNNFullyConnected"]
        assert {datatype[fc["input1_id"]], datatype[fc["filter_id"]]} == {"xnn_datatype_fp32"}
        (got,), (expected,) = result.outputs[0], result.expected[0]
        nan = torch.isnan(expected)
        assert nan.any() and torch.equal(torch.isnan(got), nan)
        finite = ~nan
        if finite.any():
            error = (got[finite].double() - expected[finite].double()).abs().max()
            assert error <= tolerance(torch.float16, expected[finite], 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_last_dim_run_too_wide_for_one_fully_connected_is_pooled(dtype):
    # No lane count divides 65537 values: one fully-connected would sum each row in one float32 chain
    # (a row of ones came out 127 float32 units off at 65535 values, 49752 at 500001); pooled, the rows
    # of ones are exact.
    width = 65537
    x = torch.ones(3, width, dtype=dtype)
    x[1] = _x(width, seed=1).to(dtype)
    result = lower_and_run(Means([((-1,), True)]), (x,))
    assert means_outside(result) == []
    assert result.counts["XNNGlobalAvgPooling2d"] == 1 and result.counts["XNNFullyConnected"] == 0
    (got,), (expected,) = result.outputs[0], result.expected[0]
    assert torch.equal(got[[0, 2]], torch.ones(2, 1, dtype=dtype))
    # The random row: a float32 sum of n values in any order is within (n - 1) u sum|x| of exact (u the
    # float32 unit roundoff), then one rounding to the output dtype.
    u = torch.finfo(torch.float32).eps / 2
    bound = (width - 1) * u * float(x[1].double().abs().mean()) + torch.finfo(dtype).eps * float(expected[1].abs())
    assert abs(float(got[1]) - float(x[1].double().mean())) <= bound
    assert [s.kind for s in plan_mean((3, width), [-1], True)] == ["reshape", "global_avg_pool", "reshape"]
    assert [s.kind for s in plan_mean((3, 65535), [-1], True)] == ["fully_connected_rows", "reshape"]
    assert [s.kind for s in plan_mean((1, 65535), [-1], True)] == ["fully_connected"]
    # with two run-time leading dims pooling needs a reshape XNNPACK cannot infer: one fully-connected
    assert [s.kind for s in plan_mean((None, None, width), [-1], True, (2, 2, width))] == ["fully_connected"]


def test_lane_count_is_the_largest_of_32_16_8_that_divides_the_width():
    # 256 is the narrowest width averaged in lanes (with more than one row).
    inputs = (_x(4, 2064, seed=1), _x(4, 2056, seed=2), _x(4, 256, seed=3))
    result = lower_and_run(LastDimMeans(), inputs)
    assert_matches(result)
    assert means_outside(result) == []
    assert result.counts["XNNStaticTranspose"] == 0
    pools, filters, _ = _value_dims(result)
    assert sorted(pools) == [[4, 8, 1, 32], [4, 129, 1, 16], [4, 257, 1, 8]]
    assert sorted(filters) == [[1, 8], [1, 16], [1, 32]]


def test_narrow_or_indivisible_width_is_one_fully_connected():
    # 300 is not a multiple of 8; 248 is, but is narrower than 256. (Lowered at these widths: one float32
    # fully-connected over ~2000 offset values sums less accurately than eager's 8-ulp tolerance.)
    inputs = (_x(32, 300, seed=1), _x(32, 248, seed=2))
    result = lower_and_run(LastDimMeans(), inputs)
    assert_matches(result)
    assert means_outside(result) == []
    assert result.counts["XNNGlobalAvgPooling2d"] == 0
    assert result.counts["XNNFullyConnected"] == 2
    for shape in ((32, 300), (32, 248), (32, 2050), (1, 32, 2050)):
        for keepdim in (True, False):
            kinds = [s.kind for s in plan_mean(shape, [-1], keepdim)]
            assert "fully_connected_rows" in kinds and "global_avg_pool" not in kinds, (shape, kinds)


def test_wide_rank_4_last_dims_are_averaged_in_lanes():
    class Rank4(nn.Module):
        def forward(self, x):
            # Over the last two dims without keepdim (with it, a 4-D mean over [2, 3] is stock's pooling).
            return x.mean(-1, keepdim=True), x.mean(-1), x.mean((-2, -1))

    result = lower_and_run(Rank4(), (_x(2, 3, 4, 1024),))
    assert_matches(result)
    assert means_outside(result) == []
    assert result.counts["XNNStaticTranspose"] == 0
    assert result.counts["XNNGlobalAvgPooling2d"] == 3 and result.counts["XNNFullyConnected"] == 3
    pools, _, _ = _value_dims(result)
    # The last-dim means have 24 rows of 1024; the mean over the last two has 6 rows of 4096.
    assert sorted(pools) == [[6, 128, 1, 32], [24, 32, 1, 32], [24, 32, 1, 32]]


def test_wide_mean_over_a_run_time_row_count_in_lanes():
    class Dyn(nn.Module):
        def forward(self, x):
            return x.mean(-1, keepdim=True), x.mean(-1)

    seq = Dim("seq", min=2, max=24)
    sizes = [2, 24] + random.Random(7).sample(range(3, 24), 3)
    runs = [(_x(2, n, 2048, seed=n),) for n in sizes]
    result = lower_and_run(Dyn(), (_x(2, 7, 2048),), run_inputs=runs, dynamic_shapes=({1: seq},))
    assert_matches(result)
    assert means_outside(result) == []
    assert result.counts["XNNGlobalAvgPooling2d"] == 2 and result.counts["XNNFullyConnected"] == 2
    pools, filters, reshapes = _value_dims(result)
    # Values are declared at the upper bound (2 x 24 rows); the reshapes infer the row count (0).
    assert pools == [[48, 64, 1, 32]] * 2
    assert filters == [[1, 32]] * 2
    assert reshapes.count([0, 64, 1, 32]) == 2
    assert [2, 0, 1] in reshapes and [2, 0] in reshapes


def test_wide_mean_over_two_run_time_dims_falls_back_to_one_fully_connected():
    # The lane form needs a reshape back to [?, ?, 1], which XNNPACK cannot infer; the plain plan needs none.
    # (512 wide, not 2048: see test_narrow_or_indivisible_width_is_one_fully_connected.)
    class Dyn2(nn.Module):
        def forward(self, x):
            return x.mean(-1, keepdim=True) * 2.0

    dims = {0: Dim("batch", min=2, max=4), 1: Dim("seq", min=2, max=16)}
    runs = [(_x(3, 9, 512, seed=1),), (_x(4, 16, 512, seed=2),)]
    result = lower_and_run(Dyn2(), (_x(2, 5, 512),), run_inputs=runs, dynamic_shapes=(dims,))
    assert_matches(result)
    assert means_outside(result) == []
    assert result.counts["XNNGlobalAvgPooling2d"] == 0 and result.counts["XNNFullyConnected"] == 1
    assert [s.kind for s in plan_mean((None, None, 512), [-1], True, (4, 16, 512))] == ["fully_connected"]
    assert [s.kind for s in plan_mean((None, 512), [-1], True, (64, 512))][:2] == ["reshape", "global_avg_pool"]


def test_auto_policy_in_a_lowered_program():
    # Policy 'auto': a float32 single row is delegated from 1024 values, in lanes (the narrowest
    # single row averaged in lanes is also 1024); narrower float32 rows stay portable; float16 rows are
    # delegated at any width, below 1024 (here 512 and 1016, both multiples of 8) as one
    # fully-connected.
    inputs = (
        _x(1, 1, 2048, seed=1),
        _x(1, 1, 1024, seed=2),
        _x(1, 1, 64, seed=3),
        _x(1, 1, 512, dtype=torch.float16, seed=4),
        _x(1, 1, 1016, dtype=torch.float16, seed=5),
    )
    result = lower_and_run(LastDimMeans(), inputs, single_row="auto")
    assert_matches(result)
    assert means_outside(result) == ["aten.mean.dim"]  # the 64-wide float32 one
    assert result.counts["XNNGlobalAvgPooling2d"] == 2 and result.counts["XNNFullyConnected"] == 4
    pools, filters, _ = _value_dims(result)
    assert sorted(pools) == [[1, 32, 1, 32], [1, 64, 1, 32]]
    assert sorted(filters) == [[1, 32], [1, 32], [1, 512], [1, 1016]]


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
    program = export(nn.Linear(2, 2), (torch.randn(1, 2),))
    with pytest.raises(TypeError, match="unknown options enable_bf61"):  # the partitioner would ignore it
        lower(program, enable_bf61=True)
    with pytest.raises(TypeError, match="means is True or False"):
        lower(program, means="no")
    with pytest.raises(TypeError, match="compile_config is an executorch.exir.EdgeCompileConfig"):
        lower(program, compile_config="x")


class TorchRmsNorms(nn.Module):
    """``torch.nn.RMSNorm`` and ``F.rms_norm``, which decompose their eps add into ``add.Scalar``."""

    def __init__(self, dtype):
        super().__init__()
        self.norm = nn.RMSNorm(32, eps=1e-6).to(dtype)
        with torch.no_grad():
            self.norm.weight.copy_(torch.linspace(0.5, 1.5, 32))

    def forward(self, x):
        return self.norm(x), nn.functional.rms_norm(x, (32,), eps=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_torch_rms_norm_is_one_delegate_with_its_eps_added_inside(dtype):
    result = lower_and_run(TorchRmsNorms(dtype), (_x(2, 5, 32, dtype=dtype),))
    assert_matches(result)  # each output is one norm: within 8 units of its dtype at its largest value
    assert result.outside == [] and result.delegates == 1
    assert result.counts["XNNAdd"] == 2  # the two eps adds, each against a one-value constant
    stock = lower_and_run(TorchRmsNorms(dtype), (_x(2, 5, 32, dtype=dtype),), stock=True)
    assert "aten.add.Scalar" in stock.outside and stock.delegates > 1


class ScalarAdds(nn.Module):
    def forward(self, x):
        return torch.ops.aten.add.Scalar(x, 0.1), torch.ops.aten.add.Scalar(x, 0.25, 3)


class ScalarAddsLeftOut(nn.Module):
    """A 0-d add (the delegate cannot return a 0-d tensor) and an integer beyond 2**53 (which a float64
    argument would round before the delegate rounds it to float32)."""

    def forward(self, x, t):
        return torch.ops.aten.add.Scalar(t, 0.5), torch.ops.aten.add.Scalar(x, 2**60 + 2**36 + 1)


def test_scalar_adds_the_delegate_cannot_compute_as_eager_stay_portable():
    result = lower_and_run(ScalarAddsLeftOut(), (torch.zeros(2, 3), torch.tensor(2.0)))
    assert result.outside == ["aten.add.Scalar", "aten.add.Scalar"]
    for got, expected in zip(result.outputs[0], result.expected[0]):
        assert torch.equal(got, expected)


def test_a_scalar_add_is_delegated_as_eager_computes_it():
    # Eager's float16 add.Scalar rounds 0.1 to float16 before adding, as the delegate's constant does;
    # the portable kernel adds it in float32, which rounds 1486 of these 4096 values the other way.
    x = torch.arange(-2048, 2048, dtype=torch.float32).mul(2**-15).half().view(4, 1024)
    result = lower_and_run(ScalarAdds(), (x,))
    assert result.outside == ["aten.add.Scalar"]  # the add with alpha 3, which XNNPACK's add cannot scale
    assert result.counts["XNNAdd"] == 1
    for got, expected in zip(result.outputs[0], result.expected[0]):
        assert torch.equal(got, expected)
    stock = lower_and_run(ScalarAdds(), (x,), stock=True)
    assert int((stock.outputs[0][0] != stock.expected[0][0]).sum()) == 1486
