"""Run a step that may crash the process in a child forked from it: a signal that ends the child becomes
an error that names the signal and what the child was doing.

The runtime runs what a program holds as native code. A program that passes every check edgefuse can make
(:mod:`edgefuse.runtime.pte_check`) may still hold a corrupt delegate payload, and loading or running it
can end the process with a segfault or an abort (ExecuTorch 1.5.1 aborts on a log line of undecodable
bytes from a damaged XNNPACK payload), which no Python code can catch. :func:`contained` runs such a step
in a forked child: it inherits the imported modules, the registered kernels and the program's bytes, and
pays for none of them again. The child notes what it is doing through a pipe and ends with its step's
result; a child killed by a signal, or that ends without a result, is reported with its last note and
the last lines it wrote on stderr (an abort's reason), which goes to a file of its own, not the terminal.

Forking a process that holds thread pools leaves the child only the forking thread. The child pins torch
to one thread before its step runs (OpenMP's pool does not survive a fork, and a child that used it hung);
the runtime's own threadpool runs XNNPACK programs in a child forked after this process loaded and ran
them on two threads. With ``until``, a child still running at that time is killed and :class:`TimedOut`
raised: a step inside every static bound can still run for hours. Where ``fork`` is not available the step
runs here, uncontained and unbounded in time.
"""

from __future__ import annotations

import ctypes
import errno
import faulthandler
import json
import os
import select
import signal
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

from edgefuse.runtime.log import flush_standard_streams, in_one_line

#: How much of the end of the child's stderr is read for its last lines, where an abort says why.
_TAIL = 4096

Note = Callable[[str], None]


class Crashed(RuntimeError):
    """The child ended before its step did: killed by ``signal`` (its name), or exited without a result.
    ``doing`` is its last note and ``last_words`` the last lines it wrote on stderr; the message says all
    three as the runtime's crash."""

    def __init__(self, message: str, signal: str | None = None, doing: str = "", last_words: str = ""):
        super().__init__(message)
        self.signal, self.doing, self.last_words = signal, doing, last_words


class TimedOut(RuntimeError):
    """The child was still running when its time was up, and was killed; ``doing`` is its last note."""

    def __init__(self, doing: str = ""):
        super().__init__(f"the step did not finish in time{f' ({doing})' if doing else ''}")
        self.doing = doing


def contained(step: Callable[[Note], Any], until: float | None = None) -> Any:
    """What ``step(note)`` returns (a JSON value: a reason it failed, or ``None``) when run in a child forked
    from this process; ``note(text)`` says what it is doing ("loading FILE").

    Raises :class:`Crashed` when the child is killed by a signal or ends without a result,
    :class:`TimedOut` when it is still running at ``until`` (a ``time.monotonic()`` time; None: no limit),
    ``OSError`` when the step ran out of disk space (:data:`NO_SPACE`), and ``RuntimeError`` with the child's
    traceback when the step raises anything else (a bug, not the program's fault).
    """
    if not hasattr(os, "fork"):
        return step(lambda _: None)
    flush_standard_streams()
    read, write = os.pipe()
    with tempfile.TemporaryFile() as stderr:
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _run_child(step, write, stderr.fileno(), os.getppid())
        os.close(write)
        data = bytearray()
        try:
            with os.fdopen(read, "rb") as channel:
                _read_until(channel.fileno(), data, until)  # until the child ends: its end closes the pipe
            status = _reap(pid, until)
        except BaseException as stop:  # out of time, or interrupted while waiting: the child goes too
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            if isinstance(stop, _OutOfTime):
                raise TimedOut(_records(bytes(data)).get("doing", "")) from None
            raise
        records = _records(bytes(data))
        stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - _TAIL))
        last_words = in_one_line(stderr.read().decode("utf-8", "replace"))
    if "no_space" in records:  # the disk, not a bug: raised as the OSError it was, for the command to name
        number, filename = records["no_space"]
        raise OSError(number, os.strerror(number), filename)
    if "raised" in records:
        raise RuntimeError(f"the step failed in its child process:\n{records['raised']}")
    doing = records.get("doing", "")
    where = f" {doing}" if doing else ""
    said = f": {last_words}" if last_words else ""
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        raise Crashed(f"the runtime crashed ({name}){where}{said}", name, doing, last_words)
    if "result" not in records:
        code = os.waitstatus_to_exitcode(status)
        raise Crashed(f"the runtime ended the process (exit status {code}){where}{said}", None, doing, last_words)
    return records["result"]


#: The errors of a full disk or quota, which a step's child reports as themselves rather than as a bug.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class _OutOfTime(Exception):
    """The child's time ran out while this process waited for it."""


def _read_until(fd: int, data: bytearray, until: float | None) -> None:
    """Add to ``data`` what the child writes to ``fd`` until it closes it; :class:`_OutOfTime` at ``until``."""
    while True:
        left = None if until is None else until - time.monotonic()
        if left is not None and left <= 0:
            raise _OutOfTime
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        data += chunk


def _reap(pid: int, until: float | None) -> int:
    """The child's exit status, waited for until ``until`` (it may close its pipe and go on)."""
    if until is None:
        return os.waitpid(pid, 0)[1]
    pause = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        left = until - time.monotonic()
        if left <= 0:
            raise _OutOfTime
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


def _run_child(step: Callable[[Note], Any], channel: int, stderr: int, parent: int) -> None:
    """The child's side: run ``step``, noting and reporting through ``channel``; never returns."""
    code = 1
    try:
        os.dup2(stderr, 2)
        faulthandler.disable()  # a crash is the parent's to report, with the runtime's own last words
        end_with_parent(parent)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
        with os.fdopen(channel, "w", encoding="utf-8") as out:
            def note(text: str) -> None:
                out.write(json.dumps({"doing": text}) + "\n")
                out.flush()

            try:
                record = {"result": step(note)}
            except BaseException as error:  # noqa: BLE001  (reported to the parent, which raises it)
                record = {"raised": traceback.format_exc()}
                if isinstance(error, OSError) and error.errno in NO_SPACE:
                    record["no_space"] = [error.errno, error.filename]
            out.write(json.dumps(record) + "\n")
        code = 0
    finally:
        os._exit(code)  # no atexit handlers, and the output this process had buffered is not written twice


def _records(data: bytes) -> dict:
    """The last value of each key the child wrote, one JSON object a line; a line cut short is skipped."""
    records: dict = {}
    for line in data.splitlines():
        try:
            records.update(json.loads(line))
        except ValueError:
            continue
    return records


#: ``prctl`` option: the signal the kernel sends this process when its parent ends (Linux).
_PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int) -> None:
    """In a forked child: have the kernel kill it when ``parent`` ends, where it can (Linux), so that a
    child never outlives the command that started it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            return
    except (OSError, AttributeError):  # no prctl: not Linux
        return
    if os.getppid() != parent:  # the parent ended before the request took effect
        os._exit(1)
