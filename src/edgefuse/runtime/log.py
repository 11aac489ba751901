"""What the ExecuTorch runtime logs: dropped when it says nothing, put into the error when a call fails.

The runtime's Python bindings log through ``sys.stderr``, a line in several pieces, flushing after each.
Setting up its threadpool logs lines about the CPU probe that concern no program; a failed load or run
raises an error that says only which call failed ("set_inputs() ... failed with error 0x12") while the
log says why ("Input 0 has unexpected scalar type: expected Float but was Half."). Both stand-ins here
replace ``sys.stderr`` for the calling thread only, under one process-wide lock.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")

#: What the runtime logs while it sets up its threadpool that says nothing about any program: its CPU
#: probe (four lines about files an x86 machine lacks, one about the CPU count) and the notice of a reset
#: its caller asked for. Each starts a line.
_SET_UP_NOISE = re.compile(r"\[cpuinfo_utils\.cpp:\d+\] |\[threadpool\.cpp:\d+\] Resetting threadpool to \d+ threads")
#: The source position the runtime starts each log line with, as in ``[method.cpp:1206] ``.
_LOG_PREFIX = re.compile(r"^\[[\w.]+:\d+\] ", re.MULTILINE)
#: The most log lines, the last ones, that an error's message takes (a failure logs two to four).
LOG_LINES_IN_ERROR = 6
_SWAP = threading.RLock()  # sys.stderr is one for the whole process


class _StandIn:
    """A text stream that stands in for ``sys.stderr`` for the thread that made it. ``target`` is the
    stream it replaces, and gives every attribute the stand-in lacks (encoding, fileno, isatty...).
    Flushing flushes the target."""

    def __init__(self, target) -> None:
        self.target = target
        self.owner = threading.get_ident()

    def flush(self) -> None:
        self.target.flush()

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        if name == "target" or name.startswith("__"):  # not set yet, or a protocol the target must not answer
            raise AttributeError(name)
        return getattr(self.target, name)


@contextlib.contextmanager
def _standing_in(make: Callable[[Any], _StandIn]) -> Iterator[Any]:
    """``sys.stderr`` replaced by ``make(sys.stderr)`` while the block runs (by a sink when it is None)."""
    with _SWAP:
        stream = make(sys.stderr if sys.stderr is not None else io.StringIO())
        with contextlib.redirect_stderr(stream):
            yield stream


class _WithoutSetUpNoise(_StandIn):
    """Passes everything to ``target`` but the runtime's set-up lines.

    Only the owning thread's text is filtered, and only text that starts with "[" waits for the end of
    its line (a held line stays held through a flush); anything else goes straight through, so another
    thread's output and a line the runtime logs before it aborts are never held back.
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

    def finish(self) -> None:
        """Write out what is still held, unless it is set-up noise."""
        if self.pending and not _SET_UP_NOISE.match(self.pending):
            self.target.write(self.pending)
        self.pending = ""
        self.target.flush()


@contextlib.contextmanager
def without_set_up_noise() -> Iterator[None]:
    """Drop the runtime's set-up lines from ``sys.stderr`` while the block runs, and pass everything else
    through: other threads' output, and any error the runtime logs."""
    with _standing_in(_WithoutSetUpNoise) as stream:
        try:
            yield
        finally:
            stream.finish()


class _Held(_StandIn):
    """Holds what its owning thread writes; passes any other thread's text to ``target`` at once."""

    def __init__(self, target) -> None:
        super().__init__(target)
        self.held = io.StringIO()

    def write(self, text: str) -> int:
        if threading.get_ident() != self.owner:
            return self.target.write(text)
        return self.held.write(text)


def printable(text: str, most: int | None = None) -> str:
    """``text`` as a message may show it: control characters and anything outside ASCII escaped (text read
    from a file, or that the runtime logged about one, must not move the terminal's cursor), cut at ``most``
    characters."""
    shown = ascii(text)[1:-1]
    return shown if most is None or len(shown) <= most else shown[:most] + "..."


def in_one_line(log: str) -> str:
    """The last :data:`LOG_LINES_IN_ERROR` lines of ``log`` without their source positions, in one
    :func:`printable` line."""
    lines = [line.strip().rstrip(".") for line in _LOG_PREFIX.sub("", log).splitlines() if line.strip()]
    shown = lines[-LOG_LINES_IN_ERROR:]
    if len(lines) > len(shown):
        shown.insert(0, f"{len(lines) - len(shown)} lines before")
    return printable("; ".join(shown))


def with_its_log(step: Callable[[], T], explained: tuple[type[Exception], ...] = (RuntimeError,)) -> T:
    """Call into the runtime, holding what it logs from this thread while the call runs.

    When the call raises one of ``explained`` (the bindings raise ``RuntimeError``, and ``IndexError``
    where a method meta has no tensor at an index), the log becomes part of the message, in an error of
    the same type, and nothing is printed; otherwise (success, another error, an interrupt) the log is
    written out as it would have been, after the call. A crash of the process itself loses it.
    """
    with _standing_in(_Held) as stream:
        try:
            result = step()
        except explained as error:
            log = in_one_line(stream.held.getvalue())
            if log:
                raise type(error)(f"{error} (the runtime logged: {log})") from error
            raise
        except BaseException:
            stream.target.write(stream.held.getvalue())
            raise
        stream.target.write(stream.held.getvalue())
        return result


def flush_standard_streams() -> None:
    """Write out what Python holds buffered for stdout and stderr: before a fork (a child would write it a
    second time) and before native code takes their descriptors over."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


@contextlib.contextmanager
def native_output_held() -> Iterator[list[str]]:
    """File descriptors 1 and 2 sent to a temporary file while the block runs, and log records below
    ERROR dropped: QNN's libraries print op tables and set-up notes from native code, which Python's own
    redirection does not catch, and they would land among the results on stdout. The list yielded holds
    what was printed once the block ends."""
    import os
    import tempfile

    from edgefuse.runtime.quiet import quiet_root_logger

    held: list[str] = []
    flush_standard_streams()
    with tempfile.TemporaryFile("w+b") as sink:
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        try:
            for fd in saved:
                os.dup2(sink.fileno(), fd)
            with quiet_root_logger():
                yield held
        finally:
            flush_standard_streams()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            held.append(sink.read().decode("utf-8", "replace"))
