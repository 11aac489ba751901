"""Run ``.pte`` programs in the released ``executorch.runtime`` and time them against each other.

Every claim the command line makes about a lowered program (it loads, it matches eager, it is faster or
slower) is checked here, on the bytes that would ship, with the real XNNPACK kernels. The timing is the
benchmark machinery: the programs run alternately (one run of each, repeated) after a warm-up, so a
change of machine load hits all of them alike; the result is each program's median. It takes any
number of programs and inputs, so ``edgefuse.xnnpack.bench`` can share it.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.utils import _pytree as pytree

from edgefuse.runtime.log import with_its_log, without_set_up_noise


@functools.cache
def start_threadpool() -> int:
    """Create the runtime's threadpool, once per process; returns the thread count it was created with.

    Creating it probes the CPU and logs five lines (``cpuinfo_utils.cpp``: "Reading file" and "Failed to
    open midr file" twice each, then "CPU info and manual query on # of cpus dont match") that say
    nothing about any program, so they are dropped.
    """
    from executorch.extension.pybindings import portable_lib

    with without_set_up_noise():
        return portable_lib._threadpool_get_thread_count()


class LoadedProgram:
    """The ``forward`` method of a loaded ``.pte``; holds the program, which must outlive its method.

    Loading and running raise errors that say what the runtime logged about the failure."""

    def __init__(self, pte: bytes, method: str = "forward") -> None:
        from executorch.runtime import Runtime

        start_threadpool()
        self.program = with_its_log(lambda: Runtime.get().load_program(pte))
        self.method = with_its_log(lambda: self.program.load_method(method))
        if self.method is None:
            raise ValueError(f"the program has no method {method!r}")

    def run(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """The tensor outputs of one run."""
        flat = list(pytree.tree_leaves(tuple(inputs)))
        result = with_its_log(lambda: self.method.execute(flat))
        return [t for t in result if isinstance(t, torch.Tensor)]


def set_threads(threads: int) -> int:
    """Reset the runtime's threadpool to ``threads`` (before loading programs); returns the count it has.

    Also pins eager PyTorch to one thread: its OpenMP workers keep spinning after a run and slow the
    runtime down on a small machine.
    """
    from executorch.extension.pybindings import portable_lib

    torch.set_num_threads(1)
    start_threadpool()
    with without_set_up_noise():  # "Resetting threadpool to N threads": the caller states the count
        portable_lib._unsafe_reset_threadpool(threads)
    return portable_lib._threadpool_get_thread_count()


@dataclass
class Timing:
    """Microsecond samples of one program; ``median`` is what a table shows."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def alternate(programs: Sequence[LoadedProgram], inputs: Sequence[Any], runs: int, warmup: int) -> list[Timing]:
    """Time each program ``runs`` times, alternating between them, after ``warmup`` untimed rounds."""
    flat = list(pytree.tree_leaves(tuple(inputs)))
    samples: list[list[float]] = [[] for _ in programs]
    for i in range(warmup + runs):
        for k, program in enumerate(programs):
            start = time.perf_counter_ns()
            program.method.execute(flat)
            elapsed = time.perf_counter_ns() - start
            if i >= warmup:
                samples[k].append(elapsed / 1e3)
    return [Timing(s) for s in samples]
