"""The seeded run CI makes finds no mismatch, exception or rebuilt near miss, and exercises the pass."""

from __future__ import annotations

import pytest

from edgefuse.fuzz.runner import Options, run
from edgefuse.fuzz.summary import format_summary
from tests.fuzz.cases import SEED


@pytest.mark.slow
def test_a_seeded_run_has_no_mismatch_exception_or_rebuilt_near_miss():
    # What CI runs: 40 cases, edge modes on 8 of them, damaged variants of 2, the malformed set, and the
    # XNNPACK flow on 1 (one test, not a fixture shared by several, so that pytest-xdist runs it once).
    options = Options(seed=SEED, cases=40, batch=40, edge_every=5, hostile_every=20, xnnpack_every=40,
                      malformed=True, out=None, progress_seconds=1e9)
    summary = run(options)
    text = format_summary(summary)
    assert not summary.failed, text
    assert summary.generated == 40
    assert sum(r.unexportable is not None for r in summary.results) <= 2, text
    by_mode = summary.checks_by_mode()
    assert by_mode["capture/aten"] >= 38 and by_mode["capture/qnn+quantization-capture"] >= 38, text
    assert by_mode["edge/qnn"] >= 6 and by_mode["edge-no-dim-order/aten"] >= 6, text
    # The run exercised the pass, not just its refusals: norms were rebuilt, compared one by one, and
    # near misses were seen.
    assert sum(r.rebuilt for r in summary.results) >= 20, text
    assert sum(r.paired for r in summary.results) >= 20 and sum(r.unpaired for r in summary.results) == 0, text
    assert sum(r.spec.near_miss is not None for r in summary.results) >= 5, text
    assert summary.hostile_cases == 2 and summary.malformed_checked >= 30, text
    assert sum(bool(r.checks) for r in summary.xnnpack_results) == 1, text
    for label in ("generated", "rebuilt", "left", "mismatches", "exceptions", "near-misses rebuilt", "unexportable",
                  "xnnpack sample", "hostile graphs", "malformed graphs"):
        assert f"\n{label} " in f"\n{text}", text
    assert "result: OK" in text

