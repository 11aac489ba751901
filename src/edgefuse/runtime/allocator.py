"""The C allocator's state in a child whose peak memory is measured.

glibc's malloc maps a block of its own when the block is at least a threshold, and serves smaller ones
from its heap, where a freed block stays resident until the heap's top is free. The threshold starts at
128 KiB and rises to the size of any mapped block freed since (up to 32 MiB), so after a process has freed
one large block its later tensors of a few MiB come from the heap, and its peak resident memory depends
on what it did before. Measured on Gemma3-1B's export in float16 with edgefuse's recipe: 7.17 GiB in a
fresh process, 9.59 GiB with the threshold held at 32 MiB; the scale command's children, forked from a
process that had already run, read between 7.1 and 10.7 GiB for either lowering. Fixing the threshold at
its start turns the rise off: a block of 128 KiB or more is mapped alone and returned when freed, so the
peak is what the step held at once, whatever ran before it.
"""

from __future__ import annotations

import ctypes

#: glibc's ``mallopt`` parameter for the threshold (``M_MMAP_THRESHOLD`` in ``malloc.h``).
M_MMAP_THRESHOLD = -3

#: The threshold glibc starts with, 128 KiB.
START_THRESHOLD = 128 * 1024


def fix_mmap_threshold() -> bool:
    """Hold glibc's mmap threshold at its starting 128 KiB, with no rise, in this process; False where the C
    library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc's own symbol: other C libraries read mallopt's parameters otherwise
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return mallopt(M_MMAP_THRESHOLD, START_THRESHOLD) == 1
