"""Run one slow step in a forked worker process while this process does another: two cores, two steps.

Lowering a transformer for XNNPACK takes tens of seconds of one core; ``edgefuse demo`` has two such
steps that do not depend on each other, and a machine with two cores can run them side by side. The
worker is forked (it inherits the imported modules and built programs, so it pays for neither again);
the caller keeps torch to one thread before it runs any tensor code, so no OpenMP pool exists to be
broken by the fork. Where ``fork`` is
not available, or there is a single core, the step runs in this process when its result is asked for:
the same code, in sequence. On Linux the worker is killed when this process ends, however it ends (a
``SIGTERM`` to this process alone would otherwise leave the worker running, holding the terminal's
output open).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

from edgefuse.runtime.contained import end_with_parent
from edgefuse.runtime.log import flush_standard_streams


class Background:
    """``submit(fn, *args)`` starts ``fn`` in a forked worker; ``result()`` of what it returns waits for it."""

    def __init__(self) -> None:
        self.executor: ProcessPoolExecutor | None = None
        if "fork" in multiprocessing.get_all_start_methods() and (os.cpu_count() or 1) >= 2:
            try:
                self.executor = ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("fork"),
                    initializer=end_with_parent,
                    initargs=(os.getpid(),),
                )
            except OSError:  # no semaphores here (a locked-down container): run in sequence
                self.executor = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> "Pending":
        flush_standard_streams()
        future = None
        if self.executor is not None:
            try:
                future = self.executor.submit(fn, *args)
            except (OSError, BrokenProcessPool):  # the fork failed: the step runs here when asked for
                future = None
        return Pending(fn, args, future)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "Background":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Pending:
    """A step's result: from the worker, or computed here when there is no worker or the worker died."""

    def __init__(self, fn: Callable[..., Any], args: tuple, future: Future | None) -> None:
        self.fn, self.args, self.future = fn, args, future

    def result(self) -> Any:
        if self.future is not None:
            try:
                return self.future.result()
            except BrokenProcessPool:
                pass  # the worker was killed (out of memory, say): do the step here instead
        return self.fn(*self.args)
