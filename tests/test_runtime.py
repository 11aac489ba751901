"""The runtime wrapper holds back what the runtime logs while it sets up its threadpool."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from executorch.extension.pybindings import portable_lib

from edgefuse.runtime import start_threadpool


def _probe(fail: bool):
    def create() -> int:
        sys.stderr.write("[cpuinfo_utils.cpp:87] Failed to open midr file\n")  # the bindings log to sys.stderr
        if fail:
            raise RuntimeError("no threadpool")
        return 3

    return create


def test_the_threadpools_set_up_lines_are_held_back(monkeypatch, capsys):
    monkeypatch.setattr(portable_lib, "_threadpool_get_thread_count", _probe(fail=False))
    assert start_threadpool.__wrapped__() == 3
    assert capsys.readouterr().err == ""


def test_the_set_up_lines_are_shown_when_creating_the_pool_fails(monkeypatch, capsys):
    monkeypatch.setattr(portable_lib, "_threadpool_get_thread_count", _probe(fail=True))
    with pytest.raises(RuntimeError, match="no threadpool"):
        start_threadpool.__wrapped__()
    assert "Failed to open midr file" in capsys.readouterr().err
    sys.stderr.write("after\n")  # standard error is the caller's again
    assert capsys.readouterr().err == "after\n"


def test_the_real_runtime_logs_nothing_while_edgefuse_starts_its_pool():
    # A fresh process whose sys.stderr is not fd 2, as in a notebook. The runtime's own reset, called
    # after, does log there: its log goes through sys.stderr, where edgefuse holds it back.
    code = textwrap.dedent(
        """
        import io, sys
        log = io.StringIO()
        sys.stderr = log
        from executorch.extension.pybindings import portable_lib
        from edgefuse.runtime import start_threadpool
        start_threadpool()
        held = log.getvalue()
        portable_lib._unsafe_reset_threadpool(1)
        sys.stderr = sys.__stderr__
        print(repr(held), "Resetting threadpool" in log.getvalue()[len(held):])
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    held = done.stdout.strip().splitlines()[-1]
    assert "cpuinfo" not in held and held.endswith("True"), done.stdout
