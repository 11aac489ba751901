"""The refusal-time measure runs each hostile config as a user would, in a fresh process, and counts a
refusal only when it exits 2 with nothing written and nothing run."""

from __future__ import annotations

import pytest

import subprocess
import sys

from edgefuse.fuzz import refusal_times


@pytest.mark.slow  # runs edgefuse in new processes
def test_each_hostile_config_is_run_cold_and_counted_refused(tmp_path, capsys):
    assert refusal_times.main(["--folder", str(tmp_path), "--only", "config with"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("config with")]
    assert len(rows) == 3, out
    assert all(row[44:49].strip() == "2" and "refused: " in row for row in rows), out
    assert not (tmp_path / "MARKER").exists() and (tmp_path / "victim.txt").read_text() == "the user's own file\n"


def test_a_refusal_that_wrote_a_file_is_not_counted(tmp_path, monkeypatch, capsys):
    # A command that exits 2 after writing the victim counts as a failure of the measure.
    real = refusal_times.subprocess.run

    def writes_then_refuses(command, **kwargs):
        (tmp_path / "victim.txt").write_text("overwritten\n")
        return real([refusal_times.sys.executable, "-c", "import sys; sys.exit(2)"], **kwargs)

    monkeypatch.setattr(refusal_times.subprocess, "run", writes_then_refuses)
    assert refusal_times.main(["--folder", str(tmp_path), "--only", "_target_"]) == 1


@pytest.mark.slow  # runs the module in a new process
def test_building_the_files_says_nothing_on_stderr(tmp_path):
    # torchao and torch's pytree warn as they are imported; none of that is the measure's to print
    run = subprocess.run([sys.executable, "-m", "edgefuse.fuzz.refusal_times", "--folder", str(tmp_path),
                          "--only", "no such input"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "checked in this process" in run.stdout, run.stdout + run.stderr
    assert run.stderr == ""
