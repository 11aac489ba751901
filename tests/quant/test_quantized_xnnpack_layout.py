"""A channels-last input behind a qs8 quantize/dequantize pair, read by a convolution and by edgefuse's means.

The input goes through one quantize/dequantize pair into a convolution (qs8) and into ``pow(x, 2)``,
which the qs8 quantizer leaves in float, as it leaves an RMSNorm's square; four means of the square
follow. edgefuse substitutes every one of them, so they run inside the delegate on a tensor the layout
pass tags channels-last: the test fails if any of them reduces the axes of the buffer as stored.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import export

from edgefuse.xnnpack import quantizer as qx
from edgefuse.quant.facts import is_quantize
from edgefuse.core._fx import ops_outside
from edgefuse.xnnpack.inspect import node_type_counts, run_pte, to_pte
from tests.quant.test_quantized_xnnpack import ConvAndMeans, _misread

pytestmark = pytest.mark.slow

F32 = torch.finfo(torch.float32).eps
DIMS = {"channels": [1], "width": [-1], "pooling": [2, 3], "channels-height": [1, 2]}


class ConvAndSquareMeans(ConvAndMeans):
    """The same convolution; the means read the square of the input."""

    def forward(self, x):
        square = x.pow(2)
        return (self.conv(x), *(square.mean(dims, keepdim=True) for dims in DIMS.values()))


@pytest.fixture(scope="module")
def lowered():
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(1, 4, 5, 7, generator=torch.Generator().manual_seed(3)).to(memory_format=torch.channels_last)
        prepared = prepare_pt2e(export(ConvAndSquareMeans().eval(), (x,)).module(), qx.qs8_quantizer())
        prepared(x)
        converted = convert_pt2e(prepared)
        program = export(converted, (x,))
        yield converted, x, program, {how: qx.lower(program, how) for how in (qx.STOCK, qx.EDGEFUSE)}
    finally:
        torch.set_num_threads(before)


def test_the_square_stays_float_and_the_input_is_quantized_once(lowered):
    converted, _, _, _ = lowered
    (square,) = [n for n in converted.graph.nodes if n.target == torch.ops.aten.pow.Tensor_Scalar]
    assert not any(is_quantize(u) for u in square.users), "the quantizer quantized the square"
    assert sum(1 for n in converted.graph.nodes if is_quantize(n)) == 2  # the input and the convolution's output


def test_edgefuse_delegates_every_mean_of_the_channels_last_square_where_stock_leaves_three(lowered):
    """Which node each mean became: channels, width and channels-height means are reshapes around global
    average pooling or a fully-connected, after one transpose of the square to NCHW; the [2, 3] mean is
    stock's pooling on the channels-last tensor, whose result is transposed back like stock's."""
    _, _, program, programs = lowered
    assert [op for op in ops_outside(programs[qx.EDGEFUSE]) if "mean" in op] == []
    assert [op for op in ops_outside(programs[qx.STOCK]) if "mean" in op] == ["aten.mean.dim"] * 3
    placements = qx.mean_placements(program, programs[qx.EDGEFUSE])
    assert [(p.reads, p.delegated) for p in placements] == [("float", True)] * 4
    reasons = dict(zip(DIMS, (p.reason for p in placements)))
    assert "stock global average pooling" in reasons.pop("pooling")
    assert reasons == {"channels": None, "width": None, "channels-height": None}, reasons
    counts = node_type_counts(programs[qx.EDGEFUSE])
    assert counts["XNNGlobalAvgPooling2d"] == 3 and counts["XNNFullyConnected"] == 1, counts
    assert counts["XNNStaticTranspose"] == 2, counts
    assert node_type_counts(programs[qx.STOCK])["XNNStaticTranspose"] == 1


def test_each_mean_reduces_the_right_axes_of_the_channels_last_input(lowered):
    """A mean of n non-negative float32 terms, summed in any order and scaled by 1/n, is within
    ``(n + 1) u`` of the exact mean at its own magnitude, ``u`` half a float32 unit (n - 1 additions,
    and two roundings for the scaling; both sides compute the square alike). Both sides round so:
    ``(n + 1)`` float32 units apart. Each bound is checked to be far below what the misread layout
    gives. The convolution's output is int8: one step
    of its scale covers an integer kernel rounding a tie the other way."""
    converted, x, _, programs = lowered
    with torch.no_grad():
        conv_expected, *means_expected = converted(x)
        dq = next(n for n in converted.graph.nodes if n.target == torch.ops.quantized_decomposed.dequantize_per_tensor.default)
        square = torch.ops.quantized_decomposed.dequantize_per_tensor(
            torch.ops.quantized_decomposed.quantize_per_tensor(x, *dq.args[1:]), *dq.args[1:]
        ).pow(2)
    conv_actual, *means_actual = run_pte(to_pte(programs[qx.EDGEFUSE]), (x,))
    conv_q = next(u for n in converted.graph.nodes if n.target == torch.ops.aten.conv2d.default for u in n.users)
    assert float((conv_actual - conv_expected).abs().max()) <= float(conv_q.args[1])
    for (name, dims), actual, expected in zip(DIMS.items(), means_actual, means_expected):
        count = x.numel() // expected.numel()
        allowed = (count + 1) * F32 * expected.abs()
        wrong = _misread(square).mean(dims, keepdim=True)
        assert float(((wrong - expected).abs() - 100 * allowed).max()) > 0, f"{name}: the check cannot tell the axes apart"
        assert actual.shape == expected.shape, name
        error = (actual - expected).abs()
        assert bool((error <= allowed).all()), f"{name}: {float(error.max()):.3g} above {float(allowed.max()):.3g}"
