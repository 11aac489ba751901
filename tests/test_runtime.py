"""The runtime wrapper holds back the lines the runtime prints while it creates its threadpool."""

from __future__ import annotations

import os

import pytest
from executorch.extension.pybindings import portable_lib

from edgefuse.runtime import start_threadpool


def _probe(fail: bool):
    def create() -> int:
        os.write(2, b"[cpuinfo_utils.cpp:87] Failed to open midr file\n")  # as the runtime writes: fd 2
        if fail:
            raise RuntimeError("no threadpool")
        return 3

    return create


def test_the_threadpools_set_up_lines_are_held_back(monkeypatch, capfd):
    monkeypatch.setattr(portable_lib, "_threadpool_get_thread_count", _probe(fail=False))
    assert start_threadpool.__wrapped__() == 3
    assert capfd.readouterr().err == ""


def test_the_set_up_lines_are_shown_when_creating_the_pool_fails(monkeypatch, capfd):
    monkeypatch.setattr(portable_lib, "_threadpool_get_thread_count", _probe(fail=True))
    with pytest.raises(RuntimeError, match="no threadpool"):
        start_threadpool.__wrapped__()
    assert "Failed to open midr file" in capfd.readouterr().err
    os.write(2, b"after\n")  # standard error is the caller's again
    assert capfd.readouterr().err == "after\n"
