"""The XNNPACK sample's checks can fail: a .pte that computes something else, a lowering that raises."""

from __future__ import annotations

import pytest

import edgefuse.runtime
import edgefuse.xnnpack
from edgefuse.fuzz.xnnpack import run_xnnpack
from tests.fuzz.cases import LLAMA, finding_kinds


@pytest.mark.slow
def test_the_xnnpack_check_reports_a_pte_that_computes_something_else(monkeypatch):
    real = edgefuse.runtime.LoadedProgram.run
    calls = []

    def first_one_off(self, inputs):  # edgefuse's program runs first, stock's (if asked) after it
        calls.append(1)
        out = real(self, inputs)
        return [t * 1.01 for t in out] if len(calls) == 1 else out

    monkeypatch.setattr(edgefuse.runtime.LoadedProgram, "run", first_one_off)
    [result] = run_xnnpack([LLAMA])
    assert finding_kinds([result]) == {"xnnpack-mismatch"} and len(calls) == 2


@pytest.mark.slow
def test_the_xnnpack_check_reports_a_lowering_that_raises(monkeypatch):
    def broken(program, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(edgefuse.xnnpack, "lower", broken)
    [result] = run_xnnpack([LLAMA])
    assert finding_kinds([result]) == {"xnnpack-exception"} and "injected" in result.findings[0].detail

