"""The errors the command line turns into exit codes, so every command fails the same way.

A library function raises one of these when the fault is the caller's input (:class:`UsageError`), a
check on the numbers failed (:class:`CheckFailed`), or a part of edgefuse that a command needs is not
installed (:class:`Unavailable`); the application prints the message and exits with the code below
(:func:`edgefuse.console.command.run_command`).
"""

from __future__ import annotations


#: Exit codes of the ``edgefuse`` command; docs/commands.md lists them too, with each case.
OK = 0
CHECK_FAILED = 1  # a check failed: a rewritten or lowered program does not match its reference
USAGE = 2  # bad usage or input: unknown model, a file that does not load or export or that ExecuTorch
# rejects, a missing .pt2, an output path that cannot be written (or a full disk)
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


def qnn_sdk_error(error: Exception, context: str = "") -> EdgefuseError:
    """The command's error for the QNN library's ``QnnSdkUnavailable``: a folder edgefuse refuses to load
    from is refused input (exit 2), libraries not set up are an unavailable part (exit 3)."""
    from edgefuse.qnn.sdk import QnnSdkUnsafe

    kind = UsageError if isinstance(error, QnnSdkUnsafe) else Unavailable
    return kind(f"{context}{error}")
