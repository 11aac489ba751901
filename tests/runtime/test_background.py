"""The forked worker of :mod:`edgefuse.runtime.background`: it returns its step's result, and ends with its parent."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from edgefuse.runtime.background import Background

#: Starts a worker that records its pid and sleeps, then ends itself with a SIGTERM, as ``kill`` would.
KILLED_PARENT = textwrap.dedent(
    """
    import os, signal, sys, time
    from edgefuse.runtime.background import Background

    def sleep(path):
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
        time.sleep(120)

    background = Background()
    assert background.executor is not None, "no forked worker on this machine"
    background.submit(sleep, sys.argv[1])
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGTERM)
    """
)


def _square(x: int) -> int:
    return x * x


def test_the_worker_returns_its_result_and_the_step_runs_here_without_one():
    with Background() as background:
        assert background.submit(_square, 7).result() == 49
    background = Background()
    background.executor = None  # no fork (or one core): the step runs when its result is asked for
    assert background.submit(_square, 8).result() == 64


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
    except FileNotFoundError:
        return False


def test_a_worker_ends_when_its_parent_is_killed(tmp_path):
    marker, errors = tmp_path / "worker.pid", tmp_path / "stderr.txt"
    with open(errors, "w") as stderr:  # not a pipe: a worker left running would hold it open
        done = subprocess.run([sys.executable, "-c", KILLED_PARENT, str(marker)], stdout=subprocess.DEVNULL,
                              stderr=stderr, timeout=60)
    assert done.returncode == -15, errors.read_text()  # ended by the SIGTERM
    worker = int(marker.read_text())
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(worker)
    if alive:
        os.kill(worker, 9)
    assert not alive, "the worker outlived its parent"
