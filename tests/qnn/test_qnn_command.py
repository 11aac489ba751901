"""``edgefuse qnn setup`` and ``edgefuse qnn env``: what they print, and exit 3 with the reason."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgefuse.cli import main
from edgefuse.cli.errors import OK, UNAVAILABLE
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
