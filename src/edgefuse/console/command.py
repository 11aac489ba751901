"""How every command of the application ends: an error a person can act on is printed as one line and
becomes its exit code, Ctrl-C becomes 130, and a bug prints its traceback."""

from __future__ import annotations

import contextlib

import sys
import traceback
from typing import Callable

from edgefuse.inputs.errors import INTERNAL, INTERRUPTED, USAGE, EdgefuseError
from edgefuse.runtime.contained import NO_SPACE


def run_command(prog: str, work: Callable[..., int], *args) -> int:
    """Run a command's ``work(*args)`` and return its exit code, so every command fails the same way: an
    :class:`EdgefuseError` prints ``PROG: message`` and returns its code, Ctrl-C returns 130, a full disk
    (here or in a step's child) prints what could not be written and returns :data:`USAGE`, as an output path
    that cannot be written does, and any other exception (a bug) prints its traceback and the internal-error
    line and returns :data:`INTERNAL`."""
    try:
        return work(*args)
    except EdgefuseError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except OSError as error:
        if error.errno not in NO_SPACE:
            return _internal(prog)
        where = f" writing {error.filename}" if error.filename else ""
        print(f"{prog}: {error.strerror}{where}: free some space, or write the output to another disk",
              file=sys.stderr)
        return USAGE
    except Exception:  # noqa: BLE001  (a bug: reported, not hidden)
        return _internal(prog)


def _internal(prog: str) -> int:
    """Print the exception being handled and the internal-error line; :data:`INTERNAL`."""
    traceback.print_exc()
    print(f"{prog}: internal error (a bug in edgefuse: please report it with the traceback above)", file=sys.stderr)
    return INTERNAL


@contextlib.contextmanager
def native_stdout_to_stderr():
    """Send what native code writes to file descriptor 1 to standard error while the block runs, so a
    command's ``--json`` output stays one JSON document: QNN's ``libQnnHtp.so`` writes a configuration note
    to standard output when ExecuTorch's QNN backend loads it. Python's ``sys.stdout`` is flushed first."""
    import os

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
