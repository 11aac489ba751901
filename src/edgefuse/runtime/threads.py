"""How many threads a benchmark may give the runtime's threadpool.

The pool's size is passed straight to ExecuTorch's ``_unsafe_reset_threadpool``, which crashes the
process on an absurd one (100000), so the commands check it first. Up to four threads per core are
allowed: more than the cores can be worth measuring (oversubscription), thousands never are.
"""

from __future__ import annotations

import os


def most_threads() -> int:
    """The largest thread count the commands accept on this machine."""
    return 4 * (os.cpu_count() or 1)


def threads_problem(threads: int) -> str | None:
    """Why ``--threads`` is no thread count to run with, or None."""
    if threads < 1:
        return "--threads must be at least 1"
    if threads > most_threads():
        return f"--threads must be at most {most_threads()} (four per core of this machine's {os.cpu_count()})"
    return None
