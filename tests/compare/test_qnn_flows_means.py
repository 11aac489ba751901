"""A quantized QNN program's mean errors: read on the output whose largest error is the worst against its
bound, as the mean of that output's absolute differences from the fake-quantized module and from float
eager (:func:`edgefuse.compare.qnn_flows.run_and_check`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import edgefuse.qnn.emulator
from edgefuse.compare import qnn_flows

#: Float eager's and the fake-quantized module's two outputs, and what the program gives: the second
#: output is the worst (0.8 of a bound of 1.0 against 0.1), and its mean differs from its largest.
FLOAT = (torch.zeros(4), torch.tensor([0.8, 0.4, 0.4, 0.4]))
FAKE = (torch.zeros(4), torch.zeros(4))
#: The module whose norms round down: 0.4 from the program at every element of the first output, 0.4 at
#: one of the four of the second, the worst.
DOWN = (torch.full((4,), 0.5), torch.tensor([0.8, 0.4, 0.0, 0.0]))
PROGRAM = [torch.full((4,), 0.1), torch.tensor([0.8, 0.0, 0.0, 0.0])]
STEP = 0.1


class _Outputs(torch.nn.Module):
    def __init__(self, outputs):
        super().__init__()
        self.outputs = outputs

    def forward(self, x):
        return tuple(o.clone() for o in self.outputs)


def _run_16a8w(monkeypatch, program_outputs=PROGRAM, float_outputs=FLOAT, rounded_down=None):
    """A 16a8w program run and checked, its emulator's outputs ``program_outputs``, float eager's
    ``float_outputs`` and each output's bound ten steps of :data:`STEP`; with ``rounded_down``, its module
    has a norm, and those are the outputs of the module whose norms round down."""
    monkeypatch.setattr(qnn_flows, "qnn_library", lambda: SimpleNamespace(
        run_on_emulator=lambda pte, inputs: [o.clone() for o in program_outputs], QnnSdkUnavailable=RuntimeError))
    monkeypatch.setattr(edgefuse.qnn.emulator, "output_tolerances",
                        lambda fake, inputs: [(STEP, SimpleNamespace(steps=10))] * 2)
    monkeypatch.setattr(edgefuse.qnn.emulator, "rms_norm_roundings", lambda fake: [] if rounded_down is None else ["norm"])
    monkeypatch.setattr(edgefuse.qnn.emulator, "rounding_down", lambda fake, norms: _Outputs(rounded_down))
    program = qnn_flows.QnnProgram("edgefuse", "16a8w", "SM8650", lowered=SimpleNamespace(reference=_Outputs(FAKE)))
    return qnn_flows.run_and_check(program, _Outputs(float_outputs), (torch.zeros(1),))


@pytest.fixture
def quantized_program(monkeypatch):
    """The program of :data:`PROGRAM`'s outputs, run and checked."""
    return _run_16a8w(monkeypatch)


def test_the_mean_errors_are_the_worst_outputs_means(quantized_program):
    assert quantized_program.error == pytest.approx(0.8)  # the worst output's largest error
    assert quantized_program.mean_error == pytest.approx(0.2)  # (0.8 + 0 + 0 + 0) / 4 from the module
    assert quantized_program.mean_float_error == pytest.approx(0.3)  # (0 + 0.4 + 0.4 + 0.4) / 4 from float


def test_an_fp16_program_has_no_mean_errors(monkeypatch):
    monkeypatch.setattr(qnn_flows, "qnn_library", lambda: SimpleNamespace(
        run_on_emulator=lambda pte, inputs: [o.clone() for o in FLOAT], QnnSdkUnavailable=RuntimeError))
    program = qnn_flows.QnnProgram("edgefuse", "fp16", "SM8650", lowered=object())
    qnn_flows.run_and_check(program, _Outputs(FLOAT), (torch.zeros(1),))
    assert program.ran and program.mean_error is None and program.mean_float_error is None


def test_a_worst_output_of_the_wrong_shape_gives_no_mean(monkeypatch):
    program = _run_16a8w(monkeypatch, program_outputs=[PROGRAM[0], PROGRAM[1][:2]])
    assert not program.within and program.error == float("inf")
    assert program.mean_error is None and program.mean_float_error is None


def test_float_eager_of_another_number_of_outputs_gives_no_mean(monkeypatch):
    program = _run_16a8w(monkeypatch, float_outputs=(*FLOAT, torch.zeros(4)))
    assert program.error == pytest.approx(0.8)  # the program against its module is still read
    assert program.mean_error is None and program.mean_float_error is None


def test_the_rounding_down_mean_is_the_worst_outputs_mean_against_the_module_rounding_down(monkeypatch):
    program = _run_16a8w(monkeypatch, rounded_down=DOWN)
    assert program.rounding_down_error == pytest.approx(0.4)  # the largest of (0, 0.4, 0, 0)
    assert program.rounding_down_mean_error == pytest.approx(0.1)  # their mean; the first output's is 0.4
    assert program.mean_error == pytest.approx(0.2)  # against the module itself


def test_a_module_without_norms_gives_no_rounding_down_mean(quantized_program):
    assert quantized_program.mean_error == pytest.approx(0.2) and quantized_program.rounding_down_mean_error is None
