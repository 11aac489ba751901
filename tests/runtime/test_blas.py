"""MKL pinned to one thread before torch loads (:mod:`edgefuse.runtime.blas`), by each timing command, and
what MKL gives the runtime's workers said in the conditions line. Each case runs in a fresh interpreter:
what counts is what happened before torch was imported there, which this test process has long passed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _python(code: str, mkl: str | None = None) -> list[str]:
    """The lines ``code`` prints in a fresh interpreter with edgefuse importable and ``MKL_NUM_THREADS``
    set to ``mkl`` at its start (None: unset) and ``OMP_NUM_THREADS`` unset. A generous time limit: a shared
    machine may pause it for minutes."""
    environment = {k: v for k, v in os.environ.items() if k not in ("MKL_NUM_THREADS", "OMP_NUM_THREADS")}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(SRC), environment.get("PYTHONPATH")]))
    if mkl is not None:
        environment["MKL_NUM_THREADS"] = mkl
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=1800)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


REPORT = ("import os, sys; print(repr(os.environ.get('MKL_NUM_THREADS')), 'torch' in sys.modules); "
          "from edgefuse.runtime.blas import blas_threads; print(blas_threads())")
PIN = "from edgefuse.runtime.blas import pin_blas_threads; pin_blas_threads(); "
ONE = "MKL 1 thread in the runtime's workers"


pytestmark = pytest.mark.skipif(
    not torch.backends.mkl.is_available() or (os.cpu_count() or 1) < 2,
    reason="needs a torch with MKL (pip's x86 CPU wheel) on 2 cores or more, where MKL's default is more than "
           "one thread; run `python -m pytest tests/runtime/test_blas.py` on such a machine")


def _unpinned(line: str) -> bool:
    return line.startswith("MKL ") and "threads in the runtime's workers (MKL_NUM_THREADS=1 was not set" in line


def test_pinning_before_torch_gives_the_runtimes_workers_one_mkl_thread():
    assert _python(PIN + REPORT) == ["'1' False", ONE]


def test_pinning_after_torch_loaded_changes_nothing_and_the_line_says_so():
    lines = _python("import torch; " + PIN + REPORT)
    assert lines[0] == "None True" and _unpinned(lines[1]), lines


def test_the_line_asks_a_fresh_thread_not_one_that_set_its_own_count():
    """``set_threads`` pins the calling thread's count (``torch.set_num_threads(1)``); the runtime's workers
    still get MKL's default, which is what the line must report."""
    lines = _python("import torch; torch.set_num_threads(1); " + REPORT)
    assert lines[0] == "None True" and _unpinned(lines[1]), lines


def test_a_count_set_after_torch_loaded_is_not_read_and_the_line_says_so():
    lines = _python("import torch, os; os.environ['MKL_NUM_THREADS'] = '1'; " + REPORT)
    assert lines[0] == "'1' True" and _unpinned(lines[1]), lines


def test_a_count_the_environment_chose_is_kept():
    assert _python(PIN + REPORT, mkl="1")[0] == "'1' False"
    lines = _python(PIN + REPORT, mkl="2")  # MKL takes at most one thread per core
    assert lines[0] == "'2' False" and lines[1].startswith("MKL 2 threads"), lines


def test_an_empty_count_is_none_and_gets_pinned():
    assert _python(PIN + REPORT, mkl="") == ["'1' False", ONE]


@pytest.mark.parametrize("call", [
    "from edgefuse.tools.scale import main; main(['--models', 'no-such-model'])",
    "from edgefuse.tools.llm_latency import main; main(['--sizes', 'nonsense'])",
    "from edgefuse.tools.xnnpack_bench import main; main(['--threads', '0'])",
    "from edgefuse.cli import main; main(['bench-llm', 'no-such-stock.pte', 'no-such-edgefuse.pte'])",
    "from edgefuse.cli import main; main(['bench', 'no-such-model'])",
])
def test_each_timing_command_pins_mkl_before_anything_loads_torch(call):
    """Each command is given input it refuses, after it has pinned MKL and before it times anything."""
    lines = _python(f"try:\n    {call}\nexcept SystemExit:\n    pass\n" + REPORT)
    assert lines[-2].startswith("'1' ") and lines[-1] == ONE, lines


@pytest.mark.parametrize("call", [
    "from edgefuse.cli import main; main(['report', 'no-such.pt2'])",
    "from edgefuse.tools.llm_latency import main; main(['--export-only'])",
])
def test_what_times_nothing_leaves_mkl_alone(call):
    lines = _python(f"try:\n    {call}\nexcept SystemExit:\n    pass\n" + REPORT)
    assert lines[-2].startswith("None "), lines
