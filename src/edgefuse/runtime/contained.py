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

Forking a process that holds thread pools leaves the child only the forking thread. Whoever runs
programs pins torch to one thread first (:func:`edgefuse.runtime.set_threads`), so no OpenMP pool
exists to be broken; the runtime's own threadpool runs XNNPACK programs in a child forked after this
process loaded and ran them on two threads. Where ``fork`` is not available the step runs here, uncontained.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import signal
import tempfile
import traceback
from typing import Callable

from edgefuse.runtime.log import in_one_line

#: How much of the end of the child's stderr is read for its last lines, where an abort says why.
_TAIL = 4096

Note = Callable[[str], None]


class Crashed(RuntimeError):
    """The child ended before its step did: killed by a signal, or exited without a result. The message
    says how, what it was doing, and the last lines it wrote on stderr."""


def contained(step: Callable[[Note], str | None]) -> str | None:
    """What ``step(note)`` returns (a reason it failed, or ``None``) when run in a child forked from this
    process; ``note(text)`` says what it is doing ("loading FILE").

    Raises :class:`Crashed` when the child is killed by a signal or ends without a result, and
    ``RuntimeError`` with the child's traceback when the step raises (a bug, not the program's fault).
    """
    if not hasattr(os, "fork"):
        return step(lambda _: None)
    read, write = os.pipe()
    with tempfile.TemporaryFile() as stderr:
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _run_child(step, write, stderr.fileno(), os.getppid())
        os.close(write)
        reaped = False
        try:
            with os.fdopen(read, "rb") as channel:
                records = _records(channel.read())  # until the child ends: its end closes the pipe
            _, status = os.waitpid(pid, 0)
            reaped = True
        finally:
            if not reaped:  # interrupted while waiting: the child goes too
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - _TAIL))
        last_words = in_one_line(stderr.read().decode("utf-8", "replace"))
    if "raised" in records:
        raise RuntimeError(f"the step failed in its child process:\n{records['raised']}")
    doing = f" {records['doing']}" if "doing" in records else ""
    said = f": {last_words}" if last_words else ""
    if os.WIFSIGNALED(status):
        raise Crashed(f"the runtime crashed ({signal.Signals(os.WTERMSIG(status)).name}){doing}{said}")
    if "result" not in records:
        raise Crashed(f"the runtime ended the process (exit status {os.waitstatus_to_exitcode(status)}){doing}{said}")
    return records["result"]


def _run_child(step: Callable[[Note], str | None], channel: int, stderr: int, parent: int) -> None:
    """The child's side: run ``step``, noting and reporting through ``channel``; never returns."""
    code = 1
    try:
        os.dup2(stderr, 2)
        faulthandler.disable()  # a crash is the parent's to report, with the runtime's own last words
        end_with_parent(parent)
        with os.fdopen(channel, "w", encoding="utf-8") as out:
            def note(text: str) -> None:
                out.write(json.dumps({"doing": text}) + "\n")
                out.flush()

            try:
                record = {"result": step(note)}
            except BaseException:  # noqa: BLE001  (reported to the parent, which raises it)
                record = {"raised": traceback.format_exc()}
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
