"""``python -m edgefuse.xnnpack.bench`` runs as a user runs it and prints a table people can read.

The benchmark is not part of the test run: this runs its smallest workload for a few rounds and checks
the table's structure (the thread count stated, what each lowering left outside, ratios that parse) and
the usage errors. It asserts no time.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgefuse.xnnpack.bench import main


def test_the_mean_workload_prints_one_row_per_shape_and_policy_with_the_thread_count():
    done = subprocess.run(
        [sys.executable, "-m", "edgefuse.xnnpack.bench", "--quick", "--only", "mean", "--runs", "10",
         "--budget", "0.05", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr  # the lowering's warnings are silenced
    lines = done.stdout.splitlines()
    assert lines[0].startswith("threads: 1 (reset with _unsafe_reset_threadpool(1) before loading)"), lines[0]
    header = next(line.split() for line in lines if line.startswith("workload"))
    rows = [line.split() for line in lines if line.startswith("mean ")]
    # float32 and float16, each at 1 row (default policy and the other one) and at 32 rows
    assert [(r[1], r[2], r[3]) for r in rows] == [
        (dtype, rows_, policy) for dtype in ("float32", "float16")
        for rows_, policy in (("1", "delegate"), ("1", "auto"), ("32", "delegate"))]
    for row in rows:
        cells = dict(zip(header[header.index("runs"):], row[-len(header[header.index("runs"):]):]))
        assert (row[4], row[5], row[6]) == ("0/1", "1xmean", "-"), row  # stock leaves the mean outside
        assert all(float(cells[name]) > 0 for name in ("ratio", "wall", "call")), row
        assert cells["floor"] == cells["fwall"] == "-"  # only the blocks have a floor
    assert lines[-1].startswith("done in ")


@pytest.mark.parametrize("argv, message", [
    (["--only", "blocks-1024"], "unknown workloads blocks-1024"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--runs", "5"], "--runs must be at least 10"),
    (["--budget", "0"], "--budget must be positive"),
])
def test_bad_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
