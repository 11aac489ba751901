"""``edgefuse qnn setup`` and ``edgefuse qnn env``: what they print, and exit 3 with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgefuse.cli import main
from edgefuse.inputs.errors import OK, UNAVAILABLE
from edgefuse.qnn import sdk as qnn_sdk_module


def test_env_prints_the_lines_another_process_needs(edgefuse_sdk, capsys):
    assert main(["qnn", "env", str(edgefuse_sdk.root)]) == OK
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if not line.startswith("#")]
    assert lines == edgefuse_sdk.shell_lines()
    shell = subprocess.run(
        ["bash", "-c", f'{out}\nprintf "%s\\n%s" "$QNN_SDK_ROOT" "$LD_LIBRARY_PATH"'],
        capture_output=True, text=True, env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": "/elsewhere"},
    )
    root, library = shell.stdout.splitlines()
    assert root == str(edgefuse_sdk.root)
    assert library == f"{edgefuse_sdk.root / qnn_sdk_module.HOST_DIR}:/elsewhere"


def test_setup_of_a_finished_folder_reuses_it_and_prints_the_same(edgefuse_sdk, capsys):
    assert main(["qnn", "setup", str(edgefuse_sdk.root)]) == OK
    captured = capsys.readouterr()
    assert "set up already: reused" in captured.err
    assert [line for line in captured.out.splitlines() if not line.startswith("#")] == edgefuse_sdk.shell_lines()


def test_env_without_libraries_exits_3_naming_the_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    assert main(["qnn", "env"]) == UNAVAILABLE
    err = capsys.readouterr().err
    assert err.startswith("edgefuse qnn env: no QNN libraries are set up: run `edgefuse qnn setup`")


def test_setup_on_another_platform_exits_3(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(qnn_sdk_module.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(qnn_sdk_module.platform, "machine", lambda: "arm64")
    assert main(["-q", "qnn", "setup", str(tmp_path / "root")]) == UNAVAILABLE
    assert "edgefuse qnn setup: QNN's x86 HTP emulator libraries exist for x86_64 Linux only" in capsys.readouterr().err
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("machine, setup_exit, expected", [
    ("aarch64", 3, 0),   # no QNN libraries for this machine: CI goes on without the tier
    ("x86_64", 3, 3),    # the tier must run here: a set-up that cannot be made fails CI
    ("aarch64", 4, 4),   # an edgefuse bug fails CI everywhere
    ("x86_64", 0, 0),
])
def test_ci_goes_on_without_the_qnn_tier_only_where_qnn_has_no_libraries(tmp_path, machine, setup_exit, expected):
    """.ci/run with stand-ins for pip, edgefuse, uname, chromium, python and CI's packaging part
    (.ci/package) that record what ran: the packaging runs only after the tests passed."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    run = Path(__file__).resolve().parents[2] / ".ci" / "run"
    (repo / ".ci" / "run").write_text(run.read_text())
    (repo / ".ci" / "package").write_text(f"#!/bin/sh\ntouch {tmp_path / 'packaged'}\n")
    (repo / ".ci" / "package").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {
        "pip": "exit 0",
        "edgefuse": f'echo "edgefuse qnn setup: the reason" >&2; exit {setup_exit}',
        "uname": f'if [ "$1" = -m ]; then echo {machine}; else echo Linux; fi',
        "python": f'echo "$*" > {tmp_path / "tests-ran"}',
        "chromium": "exit 0",
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    done = subprocess.run(
        ["bash", str(repo / ".ci" / "run")], capture_output=True, text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == expected, done.stderr
    assert (tmp_path / "tests-ran").exists() == (expected == 0)
    assert (tmp_path / "packaged").exists() == (expected == 0)
    if (machine, setup_exit) == ("aarch64", 3):
        assert "edgefuse qnn setup: the reason" in done.stderr and "no QNN tier on Linux aarch64" in done.stderr
