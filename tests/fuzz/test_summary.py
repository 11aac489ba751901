"""The summary names every kind of finding that fails a run."""

from __future__ import annotations

from edgefuse.fuzz.summary import FAILING


def test_every_failing_kind_is_named_in_the_summary():
    import edgefuse.fuzz.check as check

    kinds = {"exception", "broken-program", "dtype", "mismatch", "norm-mismatch", "wrong-norm", "near-miss-rebuilt",
             "no-reason", "fuzzer-error"}
    assert kinds <= set(FAILING) and all(kind in check.__doc__ for kind in kinds - {"fuzzer-error"})

