"""The passes decide on the tiny models exactly as recorded: a faster pass keeps every decision.

``tests/core/data/decisions.json`` holds, for each model, dtype and check, what ``RemoveRedundantCasts`` and
``RecomposeRmsNorm`` did (every field of every decision, the casts removed, the metadata of each rebuilt
node and a hash of the nodes erased and added), as the pass before its speed-ups decided. Regenerate it
with ``PYTHONPATH=src python -m tests.core.decisions_record`` only for a change meant to change decisions.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.core.decisions_record import (
    CAPTURE_ATEN, CAPTURE_QNN, DTYPES, EDGE_QNN, PAIRS, PATH, cases, key, record_program,
)

RECORDED = json.loads(PATH.read_text())


@pytest.mark.parametrize(("model", "dtype"), PAIRS)
def test_decisions_are_those_recorded(model, dtype, tiny_program):
    _, _, program = tiny_program(model, getattr(torch, dtype))
    observed = record_program(model, dtype, program)
    assert observed, "no check ran"
    for name, now in observed.items():
        before = RECORDED[name]
        assert now["decisions"] == before["decisions"], name
        assert now["removed"] == before["removed"], name
        assert now["vals"] == before["vals"], name
        assert now["graph"] == before["graph"], name


def test_every_recorded_case_is_checked():
    assert {key(*case) for case in cases()} == set(RECORDED)


def test_the_checked_cases_cover_every_check_and_dtype():
    """At least one QNN capture with quantization capture, one aten capture and one edge program for QNN,
    and both dtypes."""
    assert {check for _, _, check in cases()} == {CAPTURE_QNN, CAPTURE_ATEN, EDGE_QNN}
    assert {dtype for _, dtype, _ in cases()} == set(DTYPES)
