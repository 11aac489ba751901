"""A child whose peak memory is measured holds glibc's mmap threshold at its start, so that blocks freed
after a large one go back to the system instead of staying in the heap."""

from __future__ import annotations

import ctypes
import platform

import pytest

from edgefuse.runtime.allocator import fix_mmap_threshold
from edgefuse.runtime.contained import contained

MIB = 1 << 20


def resident() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


def freed_and_returned(fix: bool) -> int:
    """In a child: free a 16 MiB block (glibc's threshold rises to 16 MiB), then, with ``fix``, hold the
    threshold at its start; allocate 128 blocks of 1 MiB, touch them, free every other one. The bytes the
    process's resident memory fell by."""

    def step(note):
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
        libc.free.argtypes = (ctypes.c_void_p,)
        libc.free(libc.malloc(16 * MIB))
        if fix and not fix_mmap_threshold():
            return "not fixed"
        blocks = [libc.malloc(MIB) for _ in range(128)]
        for block in blocks:
            ctypes.memset(block, 1, MIB)
        before = resident()
        for block in blocks[::2]:
            libc.free(block)
        return before - resident()

    return contained(step)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator alone has this threshold; "
                    "run on a glibc Linux (`python -m pytest tests/runtime/test_allocator.py`)")
def test_blocks_freed_after_a_large_one_are_returned_only_with_the_threshold_fixed():
    returned = freed_and_returned(fix=True)
    assert returned >= 60 * MIB, returned  # 64 blocks of 1 MiB went back
    assert freed_and_returned(fix=False) < 8 * MIB  # left as holes in the heap: why the threshold is fixed
