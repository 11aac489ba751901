"""What the ExecuTorch runtime logs: dropped when it says nothing, put into the error when a call fails,
handed to :mod:`logging` otherwise.

The runtime's Python bindings log through the standard error stream, a line in several pieces, flushing
after each. Setting up its threadpool logs lines about the CPU probe that concern no program; a failed
load or run raises an error that says only which call failed ("set_inputs() ... failed with error 0x12")
while the log says why ("Input 0 has unexpected scalar type: expected Float but was Half."). A stand-in
takes the standard error stream's place while the runtime is called (under one process-wide lock: it is
one for the process) and cuts what is written into lines. A line neither dropped nor put into an error
goes to the logger :data:`LOG` when the call ends, another thread's lines included: a library writes to
no stream of its own, and the application decides where the lines go (with no logging set up, Python's
own handler writes them to standard error, as the runtime would have).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import threading
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

#: Where the lines the runtime logs go, at WARNING.
LOG = logging.getLogger(__name__)
#: What the runtime logs while it sets up its threadpool that says nothing about any program: its CPU
#: probe (four lines about files an x86 machine lacks, one about the CPU count) and the notice of a reset
#: its caller asked for. Each starts a line.
_SET_UP_NOISE = re.compile(r"\[cpuinfo_utils\.cpp:\d+\] |\[threadpool\.cpp:\d+\] Resetting threadpool to \d+ threads")
#: The source position the runtime starts each log line with, as in ``[method.cpp:1206] ``.
_LOG_PREFIX = re.compile(r"^\[[\w.]+:\d+\] ", re.MULTILINE)
#: The most log lines, the last ones, that an error's message takes (a failure logs two to four).
LOG_LINES_IN_ERROR = 6
_SWAP = threading.RLock()  # the standard error stream is one for the whole process


def _pass_on(lines: list[str]) -> None:
    for line in lines:
        LOG.warning("%s", line)


class _StandIn(io.TextIOBase):
    """A text stream that stands in for standard error while the thread that made it calls the runtime:
    what each thread writes is cut into lines, in order, each marked with whether the owner wrote it."""

    def __init__(self) -> None:
        self.owner = threading.get_ident()
        self.pending: dict[int, str] = {}
        self.lines: list[tuple[bool, str]] = []  # (written by the owning thread, the line), in order
        self.lock = threading.Lock()

    def own(self) -> list[str]:
        return [line for owned, line in self.lines if owned]

    def others(self) -> list[str]:
        return [line for owned, line in self.lines if not owned]

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        thread = threading.get_ident()
        with self.lock:
            *lines, rest = (self.pending.pop(thread, "") + text).split("\n")
            if rest:
                self.pending[thread] = rest
            self.lines += [(thread == self.owner, line) for line in lines]
        return len(text)

    def finish(self) -> None:
        """End every line still open."""
        with self.lock:
            for thread, rest in self.pending.items():
                self.lines.append((thread == self.owner, rest))
            self.pending = {}


@contextlib.contextmanager
def _standing_in(stand_in: _StandIn) -> Iterator[_StandIn]:
    """Standard error replaced by ``stand_in`` while the block runs; every line it holds ended after.
    Lines are handed to :data:`LOG` only once the stand-in is gone: with no logging set up, Python's own
    handler writes to standard error, which would be the stand-in again."""
    with _SWAP:
        try:
            with contextlib.redirect_stderr(stand_in):
                yield stand_in
        finally:
            stand_in.finish()


@contextlib.contextmanager
def without_set_up_noise() -> Iterator[None]:
    """Drop the runtime's set-up lines written while the block runs, and hand every other line to
    :data:`LOG` when it ends: other threads' lines, and any error the runtime logs."""
    stand_in = _StandIn()
    try:
        with _standing_in(stand_in):
            yield
    finally:
        _pass_on([line for owned, line in stand_in.lines if not (owned and _SET_UP_NOISE.match(line))])


def _in_one_line(log: str) -> str:
    """The last :data:`LOG_LINES_IN_ERROR` lines of ``log`` without their source positions, in one line."""
    lines = [line.strip().rstrip(".") for line in _LOG_PREFIX.sub("", log).splitlines() if line.strip()]
    shown = lines[-LOG_LINES_IN_ERROR:]
    if len(lines) > len(shown):
        shown.insert(0, f"{len(lines) - len(shown)} lines before")
    return "; ".join(shown)


def with_its_log(step: Callable[[], T]) -> T:
    """Call into the runtime, holding what it logs from this thread while the call runs.

    When the call raises a ``RuntimeError`` (what the bindings raise), the log becomes part of the
    message and goes nowhere else; otherwise (success, another error, an interrupt) its lines go to
    :data:`LOG` after the call, as do other threads' lines. A crash of the process itself loses them.
    """
    stand_in = _StandIn()
    try:
        with _standing_in(stand_in):
            result = step()
    except RuntimeError as error:
        _pass_on(stand_in.others())
        log = _in_one_line("\n".join(stand_in.own()))
        if log:
            raise RuntimeError(f"{error} (the runtime logged: {log})") from error
        raise
    except BaseException:
        _pass_on([line for _, line in stand_in.lines])
        raise
    _pass_on([line for _, line in stand_in.lines])
    return result
