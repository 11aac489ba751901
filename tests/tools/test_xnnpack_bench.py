"""``python -m edgefuse.tools.xnnpack_bench`` runs as a user runs it and prints a table people can read.

The benchmark is not part of the test run: this runs two small workloads for ten rounds and checks
the table's structure (the thread count stated, what each lowering left outside, ratios that parse) and
the usage errors, which come before torch is imported. It asserts no time.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgefuse.console.progress import SLOW_LOADING
from edgefuse.tools.xnnpack_bench import main
from tests.first_import import until_first_heavy_import


#: The last cells of every row, in the header's order ("stock us" and "edgefuse us" are one cell each).
TIMING = ("runs", "stock us", "edgefuse us", "ratio", "wall", "call", "floor", "fwall", "load")


@pytest.mark.slow  # lowers and runs the workloads
def test_the_table_has_a_row_per_shape_and_policy_with_the_thread_count_and_the_blocks_floor():
    done = subprocess.run(
        [sys.executable, "-m", "edgefuse.tools.xnnpack_bench", "--quick", "--only", "mean,blocks-512", "--runs", "10",
         "--budget", "0.05", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    # Nothing on stderr but the tool's notice of what it is doing (and, on a loaded machine, that loading
    # torch and ExecuTorch takes a while): not the import-time lines of torchao and torch's pytree, not the
    # lowering's warnings, not the threadpool's set-up lines nor its reset's (the table states the thread count).
    notices = ("python -m edgefuse.tools.xnnpack_bench: timing stock against edgefuse", SLOW_LOADING)
    assert [line for line in done.stderr.splitlines() if not any(n in line for n in notices)] == [], done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("threads: 1 (reset with _unsafe_reset_threadpool(1) before loading)"), lines[0]
    assert lines[1].startswith("1 thread(s); CPU: ") and "float16" in lines[1], lines[1]
    assert next(line for line in lines if line.startswith("workload")).rstrip().endswith(
        "runs  stock us edgefuse us  ratio  wall  call floor fwall  load")
    rows = [line.split() for line in lines if line.startswith(("mean ", "blocks-512 "))]
    # quick: float32 and float16, the mean at 1 row (default policy and the other one) and 32, the blocks at 32
    assert [tuple(r[:4]) for r in rows] == [
        (workload, dtype, count, policy) for workload, shapes in (
            ("mean", (("1", "delegate"), ("1", "auto"), ("32", "delegate"))), ("blocks-512", (("32", "delegate"),)))
        for dtype in ("float32", "float16") for count, policy in shapes]
    for row in rows:
        cells = dict(zip(TIMING, row[-len(TIMING):]))
        assert cells["runs"] == "10", row  # as asked: --runs is at most, and a short budget cuts no further
        assert all(float(cells[name]) > 0 for name in ("stock us", "edgefuse us", "ratio", "wall", "call")), row
        if row[0] == "mean":
            assert (row[4], row[5], row[6]) == ("0/1", "1xmean", "-"), row  # stock leaves the mean outside
            assert cells["floor"] == cells["fwall"] == "-"  # only the blocks have a floor
        else:
            assert row[4] == ("5/1" if row[1] == "float32" else "12/1") and row[6] == "-", row  # nothing left outside
            assert float(cells["floor"]) > 0 and float(cells["fwall"]) > 0, row
    assert lines[-1].startswith("done in ")


@pytest.mark.parametrize("argv, message", [
    (["--only", "blocks-1024"], "unknown workloads blocks-1024"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--threads", "100000"], f"--threads must be at most {4 * (os.cpu_count() or 1)}"),
    (["--runs", "5"], "--runs must be at least 10"),
    (["--budget", "0"], "--budget must be a positive number of seconds"),
    (["--budget", "nan"], "--budget must be a positive number of seconds"),
    (["--budget", "inf"], "--budget must be a positive number of seconds"),
])
def test_bad_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow  # starts python -m edgefuse.tools.xnnpack_bench
def test_a_usage_error_comes_first_with_no_notice_of_loading_torch(tmp_path):
    """The command as a user runs it never imports torch before its usage error (the process would end
    there: :mod:`tests.first_import`), so it prints no notice of loading it."""
    ran = until_first_heavy_import(["-m", "edgefuse.tools.xnnpack_bench", "--runs", "5"], tmp_path)
    assert ran.code == 2 and ran.importing is None, ran.stderr
    assert ran.said[0].startswith("usage:") and ran.said[-1].endswith("--runs must be at least 10"), ran.stderr
