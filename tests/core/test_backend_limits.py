"""Backend shape limits (``ShapeLimit`` in a profile): a norm a limit covers is rebuilt on a ``[1, rows, D]``
view of its input, or left with a reason that names the limit; and ``pow`` exponents held in constants.

Each rewrite is compared with eager on the same inputs at 2 units in the last place of the norm's dtype
(the rebuilt node reads the view of the norm's input, and the view back is exact).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from edgefuse.core.profiles import FLOAT, PROFILES, QUANTIZED, ShapeLimit
from edgefuse.core.ops import Role, table_for
from edgefuse.core.verify import compare_elementwise

from tests.harness import DIM_ORDER_MODES, MODES, cast_path, dtype_mode_cases, rewrite, rms_norm_nodes

EPS = 1e-6
LIMIT = ShapeLimit(
    name="test-limit",
    ranks=frozenset({3, 4}),
    max_last_dim=32,
    min_outer=2,
    precisions=frozenset({FLOAT}),
    remedy="rows",
    measured="a measurement",
)


def _profile(*limits: ShapeLimit):
    return dataclasses.replace(PROFILES["qnn"], name="limited", limits=limits)


class QkNorm(nn.Module):
    """Qwen3's QK norm on [B, T, H, D]: upcast, normalize, cast back, weight."""

    def __init__(self, d: int = 32):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d, generator=torch.Generator().manual_seed(1)) + 0.5)

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(x.dtype)


def _x(shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).mul(3).to(dtype)


def assert_matches_eager(rewritten, ulps=2.0):
    expected, actual = rewritten.module(*rewritten.inputs), rewritten.run(*rewritten.inputs)
    comparison = compare_elementwise(expected, actual, ulps)
    assert comparison.dtype_ok and comparison.ok, comparison


def _view_source(node):
    """The tensor a view node views, and the shape it views it in."""
    table = table_for(node.graph)
    assert table.is_a(node, Role.RESHAPE), node
    return node.args[0], list(node.args[1])


@pytest.mark.parametrize(("dtype", "mode"), dtype_mode_cases((torch.float32, torch.float16)))
def test_a_covered_norm_is_rebuilt_on_a_rows_view(mode, dtype):
    module, inputs = QkNorm().to(dtype), (_x((1, 16, 4, 32), dtype),)
    rewritten = rewrite(module, inputs, mode, backend=_profile(LIMIT))
    [decision] = rewritten.result.decisions
    assert decision.rebuilt and "test-limit: a measurement" in decision.note
    [node] = rms_norm_nodes(rewritten.graph_module)
    source, rows = _view_source(node.args[0])
    assert rows == [1, 64, 32] and cast_path(source) == ("x", ())  # the norm reads x, viewed as its rows
    [back] = node.users
    assert list(_view_source(back)[1]) == [1, 16, 4, 32]
    assert tuple(back.meta["val"].shape) == (1, 16, 4, 32) and back.meta["val"].dtype == dtype
    assert_matches_eager(rewritten)


@pytest.mark.parametrize("mode", MODES)
def test_a_norm_no_limit_covers_reads_its_input(mode):
    # [1, 64, 32] is the view itself (no dims before the last two but a 1); a last dim of 64 is over the
    # limit's; in quantization capture a float-only limit does not hold.
    for shape in ((1, 64, 32), (1, 16, 4, 64)):
        rewritten = rewrite(QkNorm(shape[-1]), (_x(shape),), mode, backend=_profile(LIMIT))
        [node] = rms_norm_nodes(rewritten.graph_module)
        assert cast_path(node.args[0]) == ("x", ()), shape
    if mode == "capture":
        rewritten = rewrite(QkNorm(), (_x((1, 16, 4, 32)),), mode, backend=_profile(LIMIT), quantization_capture=True)
        [node] = rms_norm_nodes(rewritten.graph_module)
        assert cast_path(node.args[0]) == ("x", ())


def test_a_quantized_limit_holds_in_quantization_capture():
    limit = dataclasses.replace(LIMIT, precisions=frozenset({QUANTIZED}))
    rewritten = rewrite(QkNorm(), (_x((1, 16, 4, 32)),), "capture", backend=_profile(limit), quantization_capture=True)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert _view_source(node.args[0])[1] == [1, 64, 32]
    assert_matches_eager(rewritten)
    rewritten = rewrite(QkNorm(), (_x((1, 16, 4, 32)),), "capture", backend=_profile(limit))
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(node.args[0]) == ("x", ())  # outside capture the norm is float: a quantized limit does not hold


@pytest.mark.parametrize("mode", MODES)
def test_a_leave_limit_keeps_the_norm_and_names_it(mode):
    module, inputs = QkNorm(), (_x((1, 16, 4, 32)),)
    rewritten = rewrite(module, inputs, mode, backend=_profile(dataclasses.replace(LIMIT, remedy="leave")))
    assert rms_norm_nodes(rewritten.graph_module) == []
    [decision] = rewritten.result.decisions
    assert not decision.rebuilt
    assert "computes rms_norm wrong for an input of shape [1, 16, 4, 32] in fp16 (test-limit: a measurement)" in decision.reason
    assert_matches_eager(rewritten, ulps=0)


class ChannelsLastNorm(nn.Module):
    """A norm over the last dim of a channels-last tensor: it has no [1, rows, D] view."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(32, generator=torch.Generator().manual_seed(1)) + 0.5)

    def forward(self, x):
        x = x.contiguous(memory_format=torch.channels_last)
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


@pytest.mark.parametrize("mode", ("edge", "edge-no-dim-order"))
def test_a_covered_norm_on_a_tensor_with_no_rows_view_stays(mode):
    module, inputs = ChannelsLastNorm(), (_x((1, 16, 4, 32)),)
    rewritten = rewrite(module, inputs, mode, backend=_profile(LIMIT))
    [decision] = rewritten.result.decisions
    if decision.rebuilt:  # the graph computes the norm on a contiguous copy: then it has the view
        [node] = rms_norm_nodes(rewritten.graph_module)
        assert _view_source(node.args[0])[1] == [1, 64, 32]
    else:
        assert "not contiguous, so it has no [1, rows, D] view" in decision.reason or "dim order" in decision.reason
    assert_matches_eager(rewritten)


def test_the_qnn_profile_holds_its_measured_limits():
    qnn = PROFILES["qnn"]
    assert qnn.limit_for((1, 16, 4, 32), FLOAT).name == "htp-fp16-rms-norm-layout"
    assert qnn.limit_for((2, 16, 32), FLOAT).name == "htp-fp16-rms-norm-layout"
    assert qnn.limit_for((1, 16, 4, 32), QUANTIZED) is None  # quantized: no layout limit held
    assert qnn.limit_for((1, 64, 32), FLOAT) is None and qnn.limit_for((64, 32), FLOAT) is None
    assert qnn.limit_for((1, 1, 16, 64), FLOAT) is None
    # any last dim: measured wrong from 1 to 512 ([9, 1, 40], [1, 12, 20, 64], [10, 32, 200])
    for shape in ((1, 16, 4, 64), (9, 1, 40), (10, 32, 200), (2, 16, 4096)):
        assert qnn.limit_for(shape, FLOAT).name == "htp-fp16-rms-norm-layout", shape
    assert qnn.limit_for((1, 2, 3, 4, 64), QUANTIZED).name == "htp-rms-norm-rank"
    assert qnn.limit_for((None, 16, 4, 32), FLOAT) is not None  # a size not known when built may be any


class DynamicRows(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def test_a_covered_norm_with_rows_not_known_when_built_stays():
    batch = torch.export.Dim("batch", min=2, max=8)
    rewritten = rewrite(DynamicRows(), (_x((2, 16, 32)),), "edge", backend=_profile(LIMIT), dynamic_shapes=({0: batch},))
    [decision] = rewritten.result.decisions
    assert not decision.rebuilt and "the rows of this one are not known when the program is built" in decision.reason


class ConstantExponent(nn.Module):
    """A norm whose square is ``pow`` by a constant tensor, as QNN's export passes leave ``pow(x, 2)``."""

    def __init__(self, exponent: float):
        super().__init__()
        self.register_buffer("exponent", torch.tensor(exponent))
        self.weight = nn.Parameter(torch.rand(16, generator=torch.Generator().manual_seed(1)) + 0.5)

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(torch.pow(x, self.exponent).mean(-1, keepdim=True) + EPS))


@pytest.mark.parametrize("mode", MODES)
def test_a_pow_by_a_constant_two_is_a_square(mode):
    module, inputs = ConstantExponent(2.0), (_x((2, 5, 16)),)
    rewritten = rewrite(module, inputs, mode, backend="qnn")
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    assert_matches_eager(rewritten)
    left = rewrite(ConstantExponent(3.0), inputs, mode, backend="qnn")
    [decision] = left.result.decisions
    assert not decision.rebuilt and "pow(x, 3.0), not a square" in decision.reason


class OneElementExponent(ConstantExponent):
    """``pow`` by a one-element tensor that is not 0-dim: it promotes as a tensor does, not as a number."""

    def __init__(self):
        super().__init__(2.0)
        self.exponent = torch.tensor([2.0], dtype=torch.float32)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_a_pow_by_a_one_element_tensor_of_two_is_not_a_square(mode):
    # float16 x to the power of a float32 [1] tensor is float32: a square of x in float16 it is not.
    module, inputs = OneElementExponent().half(), (_x((2, 5, 16), torch.float16),)
    rewritten = rewrite(module, inputs, mode)
    [decision] = rewritten.result.decisions
    assert not decision.rebuilt and "not a square" in decision.reason
    assert_matches_eager(rewritten, ulps=0)


class TransposedQkNorm(QkNorm):
    """Gemma 3's QK norm: the heads transposed ahead of the norm ([B, T, H, D] -> [B, H, T, D])."""

    def forward(self, x):
        return super().forward(x.transpose(1, 2))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16))
def test_a_limit_holds_for_the_tensor_rule_9_rebuilds_on(dtype):
    # In a captured graph (edge graphs copy the transpose, so rule 9 has nothing to do there), rule 9
    # rebuilds the norm on x before the transpose, and the limit is checked on x, the tensor the backend
    # will normalize: x is contiguous and has the rows view, which is viewed back and transposed as the
    # model did. Checked on the transposed view instead, the norm would be left (no rows view).
    shape = (2, 16, 4, 32)
    module, inputs = TransposedQkNorm().to(dtype), (_x(shape, dtype),)
    rewritten = rewrite(module, inputs, "capture", backend=_profile(LIMIT))
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    assert "test-limit" in decision.note and "permuted by" in decision.note
    [node] = rms_norm_nodes(rewritten.graph_module)
    source, rows = _view_source(node.args[0])
    assert rows == [1, shape[0] * shape[1] * shape[2], 32] and cast_path(source) == ("x", ())  # x, viewed
    [back] = node.users
    assert _view_source(back)[1] == list(shape)
    [permuted] = back.users
    assert list(permuted.meta["val"].shape) == [shape[0], shape[2], shape[1], 32]
    assert_matches_eager(rewritten)


class TensorPowers(nn.Module):
    """A norm whose square and rsqrt are ``pow`` by 0-dim tensors (2 and -0.5), as QNN's export passes
    leave them; with ``numbers``, the same norm written with Python numbers, the form they were lifted from."""

    def __init__(self, numbers: bool = False):
        super().__init__()
        self.numbers = numbers
        self.register_buffer("two", torch.tensor(2.0))
        self.register_buffer("minus_half", torch.tensor(-0.5))

    def forward(self, x):
        two, minus_half = (2.0, -0.5) if self.numbers else (self.two, self.minus_half)
        return x * torch.pow(torch.pow(x, two).mean(-1, keepdim=True) + EPS, minus_half)


@pytest.mark.parametrize("mode", MODES)
def test_a_pow_by_a_tensor_in_float32_is_left_outside_qnn_and_rebuilt_for_it(mode):
    # ATen's pow by a tensor is its general power function; by the number 2 or -0.5 a square or an rsqrt.
    # In float32 they round differently (about 1 element in 4 of the rsqrt), so a rebuild would move a
    # rounding; QNN's graphs hold such tensors in place of the model's numbers.
    inputs = (_x((4096, 16)),)
    left = rewrite(TensorPowers(), inputs, mode)
    [decision] = left.result.decisions
    assert not decision.rebuilt and "raises to a power held in the tensor" in decision.reason, decision
    assert_matches_eager(left, ulps=0)
    rebuilt = rewrite(TensorPowers(), inputs, mode, backend="qnn")
    [decision] = rebuilt.result.decisions
    assert decision.rebuilt, decision.reason
    # compared with the norm written with numbers, which QNN's lift stood for, at 2 units of float32
    expected, actual = TensorPowers(numbers=True)(*inputs), rebuilt.run(*inputs)
    comparison = compare_elementwise(expected, actual, 2.0)
    assert comparison.dtype_ok and comparison.ok, comparison


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_a_pow_by_a_tensor_in_a_half_dtype_is_rebuilt_for_any_backend(dtype):
    # computed in float32 and rounded to the half dtype, the general pow and the square agree
    module, inputs = TensorPowers().to(dtype), (_x((64, 16), dtype),)
    rewritten = rewrite(module, inputs, "capture")
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    assert_matches_eager(rewritten)


def _capture(module, inputs, **options):
    import edgefuse

    target = torch.export.export(module, inputs).module()
    options = {"backend": "qnn", **options}
    return target, edgefuse.recompose_rms_norm(target, quantization_capture=True, **options)


def test_a_rebuilt_norm_at_8a8w_is_viewed_and_its_note_names_the_precision():
    module, inputs = QkNorm(), (_x((1, 16, 4, 32)),)
    target, result = _capture(module, inputs, precision="8a8w")
    [decision] = result.decisions
    assert decision.rebuilt and "in 8a8w (htp-fp16-rms-norm-layout:" in decision.note
    [node] = rms_norm_nodes(target)
    assert _view_source(node.args[0])[1] == [1, 64, 32]
    comparison = compare_elementwise(module(*inputs), target(*inputs), 2.0)
    assert comparison.dtype_ok and comparison.ok, comparison


def test_a_rebuilt_norm_of_a_precision_not_known_carries_the_limits_note():
    target, result = _capture(QkNorm(), (_x((1, 16, 4, 32)),))
    [decision] = result.decisions
    assert decision.rebuilt and decision.note.startswith(
        f"no limit of qnn covers [1, 16, 4, 32] in {QUANTIZED}; yet htp-fp16-rms-norm-layout: ")
    assert "the precision it is quantized at was not known to edgefuse" in decision.note
    [node] = rms_norm_nodes(target)
    assert cast_path(node.args[0]) == ("x", ())
    _, measured_right = _capture(QkNorm(), (_x((1, 16, 4, 32)),), precision="16a8w", backend=PROFILES["qnn"].for_generation("V75"))
    assert measured_right.decisions[0].note is None


def test_a_precision_that_does_not_fit_quantization_capture_or_is_unknown_is_a_clear_error():
    import edgefuse

    target = torch.export.export(QkNorm(), (_x((1, 16, 4, 32)),)).module()
    code = target.code
    with pytest.raises(ValueError, match="precision '8a8w' does not fit quantization_capture=False"):
        edgefuse.recompose_rms_norm(target, backend="qnn", precision="8a8w")
    with pytest.raises(ValueError, match="precision 'fp16' does not fit quantization_capture=True"):
        edgefuse.recompose_rms_norm(target, backend="qnn", quantization_capture=True, precision="fp16")
    with pytest.raises(ValueError, match="unknown precision '4a4w'"):
        edgefuse.recompose_rms_norm(target, backend="qnn", quantization_capture=True, precision="4a4w")
    with pytest.raises(ValueError, match="unknown precision 'int8'"):  # not a graph edgefuse could not read
        edgefuse.recompose_rms_norm(target, backend="qnn", quantization_capture=True, precision=lambda node: "int8")
    assert target.code == code
