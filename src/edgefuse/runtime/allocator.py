"""The C allocator's state in a child whose peak memory is measured.

glibc's malloc maps a block of its own when the block is at least a threshold and the heap has no free
space for it, and serves the rest from its heap, where a freed block stays resident until the heap's top is
free past a second, trim threshold. Both start at 128 KiB; freeing a mapped block of up to 32 MiB raises the
first to that block's size and the second to twice it, so after a process has freed one large block its
later tensors of a few MiB come from the heap, and its peak resident memory depends on what it did before.
Measured on Gemma3-1B's export in float16 with edgefuse's recipe: 7.17 GiB in a fresh process and 9.59 GiB
with the mmap threshold held at 32 MiB; the scale command's children, forked from its process, had read
7.12 and 10.14 GiB for that export on two days. Holding both thresholds at their start turns the rise off:
a block of 128 KiB or more that the heap cannot serve from free space is mapped alone and returned when
freed, and the heap is trimmed as it was in a fresh process.
"""

from __future__ import annotations

import ctypes

#: glibc's ``mallopt`` parameters (``malloc.h``): the trim threshold and the mmap threshold.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: The value glibc starts both thresholds at, 128 KiB.
START_THRESHOLD = 128 * 1024


def hold_malloc_thresholds() -> bool:
    """Hold glibc's mmap and trim thresholds at their starting 128 KiB, with no rise, in this process;
    False where the C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc's own symbol: other C libraries read mallopt's parameters otherwise
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # TypeError: Windows has no process-wide library handle
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return all(mallopt(parameter, START_THRESHOLD) == 1 for parameter in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD))
