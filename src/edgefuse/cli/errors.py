"""The errors the command line turns into exit codes, so every command fails the same way.

A library function raises one of these when the fault is the caller's input (:class:`UsageError`), a
check on the numbers failed (:class:`CheckFailed`), or a part of edgefuse that a command needs is not
installed (:class:`Unavailable`); ``edgefuse.cli`` prints the message and exits with the code below.
"""

from __future__ import annotations

import sys
import traceback
from typing import Callable

#: Exit codes of the ``edgefuse`` command; the README's "Command line" section lists them too.
OK = 0
CHECK_FAILED = 1  # a check failed: a rewritten or lowered program does not match its reference
USAGE = 2  # bad usage or input: unknown model, a file that does not load or export or that ExecuTorch
# rejects, a missing .pt2, an output path that cannot be written
UNAVAILABLE = 3  # a part of edgefuse the command needs is unavailable (the XNNPACK lowering, the fuzzer)
INTERNAL = 4  # edgefuse itself failed: a bug, reported with its traceback
INTERRUPTED = 130  # Ctrl-C, as a shell reports a process SIGINT ended


class EdgefuseError(Exception):
    """An error with a message a person can act on; ``exit_code`` is what the command line returns."""

    exit_code = INTERNAL


class UsageError(EdgefuseError):
    """The command line or the MODEL it names is wrong; the message says how to fix it."""

    exit_code = USAGE


class CheckFailed(EdgefuseError):
    """A program did not match its reference within the tolerance of its dtype."""

    exit_code = CHECK_FAILED


class Unavailable(EdgefuseError):
    """A part of edgefuse that the command needs cannot be imported in this installation."""

    exit_code = UNAVAILABLE


def run_command(prog: str, work: Callable[..., int], *args) -> int:
    """Run a command's ``work(*args)`` and return its exit code, so every command fails the same way: an
    :class:`EdgefuseError` prints ``PROG: message`` and returns its code, Ctrl-C returns 130, and any other
    exception (a bug) prints its traceback and the internal-error line and returns :data:`INTERNAL`."""
    try:
        return work(*args)
    except EdgefuseError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception:  # noqa: BLE001  (a bug: reported, not hidden)
        traceback.print_exc()
        print(f"{prog}: internal error (a bug in edgefuse: please report it with the traceback above)",
              file=sys.stderr)
        return INTERNAL
