"""MKL pinned to one thread before torch loads (:mod:`edgefuse.runtime.blas`), by each timing command, and
said in the conditions line. Each case runs in a fresh interpreter: what counts is what happened before
torch was imported there, which this test process has long passed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _python(code: str, **env: str) -> list[str]:
    """The lines ``code`` prints in a fresh interpreter with edgefuse importable and ``env`` set (a value
    of "" removes the variable)."""
    environment = {k: v for k, v in os.environ.items() if k != "MKL_NUM_THREADS"}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(SRC), environment.get("PYTHONPATH")]))
    environment.update({k: v for k, v in env.items() if v})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


REPORT = "import os, sys; print(os.environ.get('MKL_NUM_THREADS'), 'torch' in sys.modules); " \
         "from edgefuse.runtime.blas import blas_threads; print(blas_threads())"


def test_pinning_before_torch_asks_mkl_for_one_thread():
    lines = _python("from edgefuse.runtime.blas import pin_blas_threads; print(pin_blas_threads()); " + REPORT)
    assert lines == ["True", "1 False", "MKL 1 thread(s) (MKL_NUM_THREADS)"]


def test_pinning_after_torch_loaded_changes_nothing_and_says_so():
    lines = _python("import torch; from edgefuse.runtime.blas import pin_blas_threads; print(pin_blas_threads()); "
                    + REPORT)
    assert lines[:2] == ["False", "None True"]
    assert lines[2].startswith("MKL threads not pinned (MKL_NUM_THREADS unset when torch loaded)")


def test_a_count_the_environment_chose_is_kept():
    lines = _python("import torch; from edgefuse.runtime.blas import pin_blas_threads; print(pin_blas_threads()); "
                    + REPORT, MKL_NUM_THREADS="3")
    assert lines == ["True", "3 True", "MKL 3 thread(s) (MKL_NUM_THREADS)"]


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
    assert lines[-2].startswith("1 "), lines
    assert lines[-1] == "MKL 1 thread(s) (MKL_NUM_THREADS)"


def test_other_commands_leave_mkl_alone():
    lines = _python("try:\n    from edgefuse.cli import main; main(['report', 'no-such.pt2'])\nexcept SystemExit:\n"
                    "    pass\n" + REPORT)
    assert lines[-2].startswith("None ")
