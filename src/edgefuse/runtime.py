"""Run ``.pte`` programs in the released ``executorch.runtime`` and time them against each other.

Every claim the command line makes about a lowered program (it loads, it matches eager, it is faster or
slower) is checked here, on the bytes that would ship, with the real XNNPACK kernels. The timing is the
benchmark machinery: the programs run alternately (one run of each, repeated) after a warm-up, so a
change of machine load hits all of them alike; the result is each program's median. It takes any
number of programs and inputs, so ``edgefuse.xnnpack.bench`` can share it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch
from torch.utils import _pytree as pytree


#: What the runtime logs while it sets up its threadpool that says nothing about any program: its CPU
#: probe (four lines about files an x86 machine lacks, one about the CPU count) and the notice of a reset
#: its caller asked for. Each starts a line.
_SET_UP_NOISE = re.compile(r"\[cpuinfo_utils\.cpp:\d+\] |\[threadpool\.cpp:\d+\] Resetting threadpool to \d+ threads")
_SWAP = threading.RLock()  # sys.stderr is one for the whole process


class _StandIn:
    """A text stream that stands in for ``sys.stderr`` for the thread that made it: ``target`` is the
    stream it replaces, which gives every attribute the stand-in lacks (encoding, fileno, isatty...)."""

    def __init__(self, target) -> None:
        self.target = target
        self.owner = threading.get_ident()

    def flush(self) -> None:
        self.target.flush()

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        if name in ("target", "owner", "pending", "held") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.target, name)


class _WithoutSetUpNoise(_StandIn):
    """A text stream that passes everything to ``target`` but the runtime's set-up lines.

    Only the text of the thread that sets up the pool is filtered, and only text that starts with "["
    waits for the end of its line; anything else goes straight through, so another thread's output and
    a line the runtime logs before it aborts are never held back.
    """

    def __init__(self, target) -> None:
        super().__init__(target)
        self.pending = ""

    def write(self, text: str) -> int:
        if threading.get_ident() != self.owner:
            return self.target.write(text)
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if not _SET_UP_NOISE.match(line):
                self.target.write(line + "\n")
        if self.pending and not self.pending.startswith("["):
            self.target.write(self.pending)
            self.pending = ""
        return len(text)

    def flush(self) -> None:
        """Flush the target; a held line stays held (the bindings flush after every piece of a line)."""
        self.target.flush()

    def finish(self) -> None:
        """Write out what is still held, unless it is set-up noise."""
        if self.pending and not _SET_UP_NOISE.match(self.pending):
            self.target.write(self.pending)
        self.pending = ""
        self.target.flush()


@contextlib.contextmanager
def _without_set_up_noise() -> Iterator[None]:
    """Drop the runtime's set-up lines from ``sys.stderr`` (its bindings log there) while the block runs,
    and pass everything else through: other threads' output, and any error the runtime logs."""
    with _SWAP:
        if sys.stderr is None:
            yield
            return
        stream = _WithoutSetUpNoise(sys.stderr)
        try:
            with contextlib.redirect_stderr(stream):
                yield
        finally:
            stream.finish()


T = TypeVar("T")
#: The source position the runtime starts each log line with, as in ``[method.cpp:1206] ``.
_LOG_PREFIX = re.compile(r"^\[[\w.]+:\d+\] ", re.MULTILINE)


class _HeldForThisThread(_StandIn):
    """A text stream that holds what its owning thread writes and passes any other thread's to ``target``."""

    def __init__(self, target) -> None:
        super().__init__(target)
        self.held = io.StringIO()

    def write(self, text: str) -> int:
        if threading.get_ident() != self.owner:
            return self.target.write(text)
        return self.held.write(text)


def _with_its_log(step: Callable[[], T]) -> T:
    """Call into the runtime, holding what it logs from this thread (its bindings log to ``sys.stderr``).

    The runtime's exceptions say only which call failed ("set_inputs() ... failed with error 0x12") and
    its log says why ("Input 0 has unexpected scalar type: expected Float but was Half."), so on failure
    the log becomes part of the error's message, and nothing is printed; on success what it logged is
    written out as it would have been.
    """
    with _SWAP:
        if sys.stderr is None:
            return step()
        stream = _HeldForThisThread(sys.stderr)
        try:
            with contextlib.redirect_stderr(stream):
                result = step()
        except Exception as error:
            lines = _LOG_PREFIX.sub("", stream.held.getvalue()).splitlines()
            log = "; ".join(line.strip() for line in lines if line.strip())
            if not log:
                raise
            raise RuntimeError(f"{error} (the runtime logged: {log})") from error
        stream.target.write(stream.held.getvalue())
        return result

@functools.cache
def start_threadpool() -> int:
    """Create the runtime's threadpool, once per process; returns the thread count it was created with.

    Creating it probes the CPU and logs five lines (``cpuinfo_utils.cpp``: "Reading file" and "Failed to
    open midr file" twice each, then "CPU info and manual query on # of cpus dont match") that say
    nothing about any program, so they are dropped.
    """
    from executorch.extension.pybindings import portable_lib

    with _without_set_up_noise():
        return portable_lib._threadpool_get_thread_count()


class LoadedProgram:
    """The ``forward`` method of a loaded ``.pte``; holds the program, which must outlive its method.

    Loading and running raise errors that say what the runtime logged about the failure."""

    def __init__(self, pte: bytes, method: str = "forward") -> None:
        from executorch.runtime import Runtime

        start_threadpool()
        self.program = _with_its_log(lambda: Runtime.get().load_program(pte))
        self.method = _with_its_log(lambda: self.program.load_method(method))
        if self.method is None:
            raise ValueError(f"the program has no method {method!r}")

    def run(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """The tensor outputs of one run."""
        flat = list(pytree.tree_leaves(tuple(inputs)))
        result = _with_its_log(lambda: self.method.execute(flat))
        return [t for t in result if isinstance(t, torch.Tensor)]


def set_threads(threads: int) -> int:
    """Reset the runtime's threadpool to ``threads`` (before loading programs); returns the count it has.

    Also pins eager PyTorch to one thread: its OpenMP workers keep spinning after a run and slow the
    runtime down on a small machine.
    """
    from executorch.extension.pybindings import portable_lib

    torch.set_num_threads(1)
    start_threadpool()
    with _without_set_up_noise():  # "Resetting threadpool to N threads": the caller states the count
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
