"""The QNN limits in ``PROFILES["qnn"]``, held to QNN's x86 HTP emulator.

Each limit is pinned: the stock op QNN computes wrong (or rejects) is still wrong with this QNN, so a QNN
that fixes it fails a test here and the limit can go. Each rule is checked: the norm edgefuse rebuilds
under it runs right on the emulator, and the same norm rebuilt with the rule removed does not.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgefuse.core.profiles
from edgefuse.core.profiles import PROFILES
from edgefuse.qnn import QnnLoweringFailed, lower
from edgefuse.runtime import LoadedProgram



pytestmark = [pytest.mark.usefixtures("qnn_sdk"), pytest.mark.slow]

LAYOUT, RANK = (limit.name for limit in PROFILES["qnn"].limits)


def _x(shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 1.5


class StockRmsNorm(nn.Module):
    """``F.rms_norm`` as written: the aten op QNN's own builder turns into ``RmsNorm``."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d, generator=torch.Generator().manual_seed(1)) + 0.5)

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, 1e-6)


class QkNorm(nn.Module):
    """A decomposed norm as ExecuTorch's Llama writes it, for QK norms on ``[B, T, H, D]`` and the like."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d, generator=torch.Generator().manual_seed(1)) + 0.5)

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.weight


def _fp16_error(module, x):
    lowered = lower(module, (x,), precision="fp16", recompose="stock" if isinstance(module, StockRmsNorm) else "edgefuse")
    actual = LoadedProgram(lowered.to_pte()).run((x,))[0]
    return lowered, float((actual - module(x)).abs().max()), float(module(x).abs().max())


def _allowed(scale):
    """A float16 RmsNorm rounds its input, weight and output: three half-units of float16 at the scale."""
    return 3 * 0.5 * torch.finfo(torch.float16).eps * scale * 2


@pytest.mark.parametrize("shape", [(1, 16, 4, 32), (2, 16, 32), (1, 12, 20, 64), (10, 32, 200)])
def test_htp_fp16_still_computes_these_rms_norms_wrong(shape):
    # the limit's pin: wrong by about the output's own magnitude, far over any rounding, or not a number
    # (a wrong norm reads memory it did not write, which may hold a NaN's bits)
    _, error, scale = _fp16_error(StockRmsNorm(shape[-1]), _x(shape))
    assert not error <= 0.5 * scale, (f"QNN now computes {shape} right: the {LAYOUT} limit may go", error)


def test_htp_fp16_computes_the_rows_view_right():
    _, error, scale = _fp16_error(StockRmsNorm(32), _x((1, 64, 32)))
    assert error <= _allowed(scale), error


def test_htp_still_rejects_a_rank_5_rms_norm():
    with pytest.raises(QnnLoweringFailed, match="rms_norm"):
        _fp16_error(StockRmsNorm(32), _x((1, 2, 4, 4, 32)))


@pytest.fixture
def without(monkeypatch):
    """Remove one limit from the qnn profile for the test (the rule removed)."""

    def remove(name):
        qnn = PROFILES["qnn"]
        kept = tuple(limit for limit in qnn.limits if limit.name != name)
        monkeypatch.setitem(edgefuse.core.profiles.PROFILES, "qnn", dataclasses.replace(qnn, limits=kept))

    return remove


def test_a_qk_norm_rebuilt_on_its_rows_runs_right(without):
    x = _x((1, 16, 4, 32))
    lowered, error, scale = _fp16_error(QkNorm(32), x)
    [decision] = lowered.decisions
    assert decision.rebuilt and LAYOUT in decision.note
    [rms_norm] = [op for g in lowered.graphs.delegates for op in g.ops if op.type == "RmsNorm"]
    assert rms_norm.inputs[0][0] == (1, 64, 32)
    # the model rounds to float16 around the norm where eager does not: one more half-unit, at most
    assert error <= _allowed(scale) + 0.5 * torch.finfo(torch.float16).eps * scale, error
    without(LAYOUT)
    _, wrong, _ = _fp16_error(QkNorm(32), x)
    assert wrong > _allowed(scale) * 10, wrong


def test_a_rank_5_norm_rebuilt_on_its_rows_lowers_and_runs_right(without):
    x = _x((1, 2, 4, 4, 64))
    lowered, error, scale = _fp16_error(QkNorm(64), x)
    [decision] = lowered.decisions
    assert decision.rebuilt and RANK in decision.note
    assert lowered.graphs.rms_norms == 1 and lowered.graphs.outside == []
    assert error <= _allowed(scale) + 0.5 * torch.finfo(torch.float16).eps * scale, error
    without(RANK)
    with pytest.raises(QnnLoweringFailed):
        _fp16_error(QkNorm(64), x)


def _8a8w_steps_off(module, x):
    """How many quantization steps of its output the 8a8w program is off its fake-quantized module on the
    emulator, and the lowering."""
    from edgefuse.qnn.emulator import output_steps

    lowered = lower(module, (x,), precision="8a8w")
    actual = LoadedProgram(lowered.to_pte()).run((x,))[0]
    with torch.no_grad():
        expected = lowered.reference(x)
    [step] = output_steps(lowered.reference)
    return lowered, float((actual - expected).abs().max()) / step


def test_at_8a8w_the_layout_limit_views_the_rebuilt_norm_and_the_program_is_right(monkeypatch):
    """The 8a8w rule: a rebuilt norm on ``[2, 16, 32]`` is viewed as ``[1, 32, 32]`` during capture and
    lands within the sweep's threshold; with 8a8w taken out of the limit's precisions the same norm
    reaches QNN as written and is over a hundred steps off. A whole norm's case is
    ``tests/qnn/test_qnn_legalize.py``'s at 8a8w: stock's program of it wrong on this SoC, edgefuse's
    viewed during capture and right."""
    from edgefuse.core.verify import TOLERANCES

    module, x, threshold = QkNorm(32), _x((2, 16, 32)), TOLERANCES["qnn sweep quantized"].ulps
    lowered, steps = _8a8w_steps_off(module, x)
    assert steps <= threshold, steps
    assert [op.inputs[0][0] for g in lowered.graphs.delegates for op in g.ops if op.type == "RmsNorm"] == [(1, 32, 32)]
    qnn = PROFILES["qnn"]
    limits = tuple(
        dataclasses.replace(l, precisions=l.precisions - {"8a8w"}) if l.name == LAYOUT else l for l in qnn.limits
    )
    monkeypatch.setitem(edgefuse.core.profiles.PROFILES, "qnn", dataclasses.replace(qnn, limits=limits))
    _, wrong = _8a8w_steps_off(module, x)
    assert wrong > threshold * 10, wrong
