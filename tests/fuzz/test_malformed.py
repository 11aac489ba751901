"""Malformed graphs get reasons from the pass, never a traceback, and the malformed check can fail."""

from __future__ import annotations

import dataclasses

import pytest

import edgefuse
from edgefuse.fuzz.malformed import check_malformed, malformed_graphs


@pytest.mark.parametrize("item", list(malformed_graphs()), ids=[m.name for m in malformed_graphs()])
@pytest.mark.parametrize("backend", ["aten", "qnn"])
def test_a_malformed_graph_gets_reasons_not_a_traceback(item, backend):
    assert check_malformed(item, backend, False) is None


def test_the_malformed_check_reports_a_traceback_a_missing_reason_and_a_rebuilt_nan_eps(monkeypatch):
    nan_eps = next(m for m in malformed_graphs() if m.name == "eps is nan")
    real = edgefuse.recompose_rms_norm
    monkeypatch.setattr(edgefuse, "recompose_rms_norm", lambda *a, **k: 1 / 0)
    assert "ZeroDivisionError" in check_malformed(nan_eps, "aten", False)

    def deciding(change):
        """The real pass, with ``change`` made to each of its decisions."""
        def changed(*a, **k):
            result = real(*a, **k)
            result.decisions[:] = [change(d) for d in result.decisions]
            return result

        return changed

    monkeypatch.setattr(edgefuse, "recompose_rms_norm", deciding(lambda d: dataclasses.replace(d, rebuilt=True)))
    assert "rebuilt" in check_malformed(nan_eps, "aten", False)
    monkeypatch.setattr(edgefuse, "recompose_rms_norm", deciding(lambda d: dataclasses.replace(d, reason=None)))
    assert "without a reason" in check_malformed(nan_eps, "aten", False)
