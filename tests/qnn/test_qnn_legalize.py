"""Whole norms held to QNN's limits on the x86 HTP emulator, on three HTP generations.

A QK norm written as ``nn.RMSNorm`` reaches QNN as one ``aten.rms_norm``: stock sends it on its
``[1, S, heads, 32]`` or ``[B, heads, S, 32]`` input, which the HTP computes wrong in float16; edgefuse
normalizes it on a ``[1, rows, 32]`` view and the program is right. Stock's norms are measured one per
program (a wrong norm can corrupt the other outputs of its program); edgefuse's, all right, share one.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgefuse.core.legalize import VIEWED
from edgefuse.core.verify import TOLERANCES, compare
from edgefuse.qnn import QnnLoweringFailed, lower
from edgefuse.qnn.emulator import compare_at_steps, output_steps, run_on_emulator

pytestmark = [pytest.mark.usefixtures("qnn_sdk"), pytest.mark.slow]  # lowered for QNN, run on the emulator

#: One SoC of each of three HTP generations (V73, V75, V79).
SOCS = ("SM8550", "SM8650", "SM8750")
#: A prefill of 16 tokens, 4 heads of dim 32: the QK norm's input as ExecuTorch's Llama has it, and as
#: the static Llama of ExecuTorch's QNN examples has it.
QK_SHAPES = ((1, 16, 4, 32), (1, 4, 16, 32))


class QkNorms(nn.Module):
    """One whole ``nn.RMSNorm`` per input, each with its own weight."""

    def __init__(self, count: int, d: int = 32):
        super().__init__()
        self.norms = nn.ModuleList(nn.RMSNorm(d, eps=1e-6) for _ in range(count))
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for norm in self.norms:
                norm.weight.copy_((torch.rand(d, generator=gen) + 0.5).half().float())

    def forward(self, *xs):
        return tuple(norm(x) for norm, x in zip(self.norms, xs))


def _x(shape, seed=0):
    """A float16-exact input with rows of different scales, so a norm that reads another row's rms shows."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.exp(torch.empty(*shape[:-1], 1).uniform_(-0.7, 0.7, generator=gen))
    return (torch.randn(*shape, generator=gen) * scales * 1.5).half().float()


def _errors(module, inputs, soc, recompose):
    """The lowered program and, per output, its comparison with eager at the float16 QNN tolerance."""
    lowered = lower(module, inputs, soc=soc, precision="fp16", recompose=recompose)
    actual = run_on_emulator(lowered.to_pte(), inputs)
    with torch.no_grad():
        expected = module(*inputs)
    ulps = TOLERANCES["qnn float16"].ulps
    return lowered, [compare(e, a.float(), ulps, dtype=torch.float16) for e, a in zip(expected, actual)]


@pytest.mark.slow
@pytest.mark.parametrize("soc", SOCS)
def test_a_whole_qk_norm_at_head_dim_32_is_wrong_with_stock_and_right_with_edgefuse(soc):
    inputs = tuple(_x(shape, seed) for seed, shape in enumerate(QK_SHAPES))
    for x in inputs:
        _, [stock] = _errors(QkNorms(1), (x,), soc, "stock")
        # wrong: far off, or not a number (a wrong norm reads memory it did not write)
        assert not stock.ok and not stock.max_error <= 10 * stock.allowed, (soc, list(x.shape), stock)
    lowered, ours = _errors(QkNorms(len(inputs)), inputs, soc, "edgefuse")
    assert all(c.ok for c in ours), (soc, ours)
    to_edge = [n for run in lowered.runs if run.pipeline == "to_edge" for n in run.legalized]
    assert [(n.action, n.shape) for n in to_edge] == [(VIEWED, shape) for shape in QK_SHAPES]
    assert sorted(op.inputs[0][0] for g in lowered.graphs.delegates for op in g.ops if op.type == "RmsNorm") == [
        (1, 64, 32), (1, 64, 32)]


@pytest.mark.slow
def test_a_whole_rank_5_norm_quantized_is_viewed_during_capture_and_adds_no_requantization():
    x = _x((1, 2, 4, 4, 64))
    with pytest.raises(QnnLoweringFailed):
        lower(QkNorms(1, 64), (x,), precision="16a8w", recompose="stock")
    lowered = lower(QkNorms(1, 64), (x,), precision="16a8w")
    capture = [n for run in lowered.runs if run.pipeline == "annotation" for n in run.legalized]
    assert [(n.action, n.limit) for n in capture] == [(VIEWED, "htp-rms-norm-rank")]
    # the views share their input's encoding: beside the program's own quantize (in) and dequantize (out),
    # the QNN graph holds the norm and two reshapes, and no requantization
    ops = sorted(op.type for g in lowered.graphs.delegates for op in g.ops)
    assert ops == ["Dequantize", "Quantize", "Reshape", "Reshape", "RmsNorm"], ops
    [actual] = run_on_emulator(lowered.to_pte(), (x,))
    with torch.no_grad():
        [expected] = lowered.reference(x)
    [step] = output_steps(lowered.reference)
    assert compare_at_steps(expected, actual, step, steps=1).ok


def test_a_soc_qnn_does_not_compile_float16_for_is_refused_before_any_work():
    with pytest.raises(QnnLoweringFailed, match="does not compile an RmsNorm in fp16 for QCM6490"):
        lower(QkNorms(1), (_x((1, 8, 32)),), soc="QCM6490", precision="fp16")


#: The two HTP generations beside SM8650's on which 8a8w was measured wrong on the float16 layout's shapes.
SOCS_8A8W = ("SM8650", "SM8750")


def _at_8a8w(x, soc, recompose):
    """The program lowered at 8a8w, its output on the emulator, its fake-quantized module's, and the step."""
    lowered = lower(QkNorms(1), (x,), soc=soc, precision="8a8w", recompose=recompose)
    [actual] = run_on_emulator(lowered.to_pte(), (x,))
    with torch.no_grad():
        [expected] = lowered.reference(x)
    [step] = output_steps(lowered.reference)
    return lowered, actual, expected, step


@pytest.mark.slow
@pytest.mark.parametrize("soc", SOCS_8A8W)
def test_a_whole_norm_at_8a8w_is_wrong_with_stock_and_right_with_edgefuse(soc):
    """``[2, 16, 32]``: stock's program is far off its fake-quantized module (124 steps on SM8650); edgefuse
    views the norm during capture as ``[1, 32, 32]``, and its program lands within a few steps of its own.
    The view costs nothing: edgefuse's fake-quantized module gives stock's values exactly."""
    x = _x((2, 16, 32))
    steps = TOLERANCES["qnn sweep quantized"].ulps
    _, theirs, stock_reference, stock_step = _at_8a8w(x, soc, "stock")
    assert not compare_at_steps(stock_reference, theirs, stock_step, steps).ok, soc
    lowered, ours, reference, step = _at_8a8w(x, soc, "edgefuse")
    assert compare_at_steps(reference, ours, step, steps).ok, (soc, float((ours - reference).abs().max()) / step)
    assert step == stock_step and torch.equal(reference, stock_reference)
    capture = [n for run in lowered.runs if run.pipeline == "annotation" for n in run.legalized]
    assert [(n.action, n.limit) for n in capture] == [(VIEWED, "htp-fp16-rms-norm-layout")]
    assert "wrong for an input of shape [2, 16, 32] in 8a8w" in capture[0].reason
    assert [(run.pipeline, run.precision) for run in lowered.runs if run.name == "RecomposeRmsNorm"] == [
        ("annotation", "8a8w"), ("to_edge", "fp16")]
    assert [op.inputs[0][0] for g in lowered.graphs.delegates for op in g.ops if op.type == "RmsNorm"] == [(1, 32, 32)]

