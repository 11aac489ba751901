"""A child whose peak memory is measured holds glibc's mmap and trim thresholds at their start, so that
blocks freed after a large one go back to the system instead of staying in the heap."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from edgefuse.runtime import allocator

MIB = 1 << 20

#: In a fresh interpreter: free a 16 MiB block (glibc's thresholds rise to 16 and 32 MiB), then, when the
#: argument says so, hold them at their start. Print the bytes the process's resident memory fell by when
#: every other one of 128 touched blocks of 1 MiB is freed (mapped alone under the mmap threshold), and
#: then when 256 touched blocks of 64 KiB, the heap's top, are freed (trimmed under the trim threshold).
STEP = textwrap.dedent("""
    import ctypes, sys
    from edgefuse.runtime.allocator import hold_malloc_thresholds

    def resident():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.free(libc.malloc(16 << 20))
    if sys.argv[1] == "fix" and not hold_malloc_thresholds():
        sys.exit("not fixed")
    blocks = [libc.malloc(1 << 20) for _ in range(128)]
    for block in blocks:
        ctypes.memset(block, 1, 1 << 20)
    before = resident()
    for block in blocks[::2]:
        libc.free(block)
    mapped = before - resident()
    small = [libc.malloc(64 << 10) for _ in range(256)]
    for block in small:
        ctypes.memset(block, 1, 64 << 10)
    before = resident()
    for block in reversed(small):
        libc.free(block)
    print(mapped, before - resident())
""")


def freed_and_returned(how: str) -> tuple[int, int]:
    """The bytes :data:`STEP` reports, run in a fresh interpreter with no allocator setting in its
    environment (the test's own process may hold free heap space that would serve the blocks)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    done = subprocess.run([sys.executable, "-c", STEP, how], capture_output=True, text=True, env=env, check=True)
    mapped, trimmed = done.stdout.split()
    return int(mapped), int(trimmed)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator alone has these thresholds; "
                    "run on a glibc Linux (`python -m pytest tests/runtime/test_allocator.py`)")
def test_blocks_freed_after_a_large_one_are_returned_only_with_both_thresholds_held():
    mapped, trimmed = freed_and_returned("fix")
    assert mapped >= 60 * MIB and trimmed >= 12 * MIB  # the 64 MiB of holes and the 16 MiB top went back
    mapped, trimmed = freed_and_returned("leave")
    assert mapped < 8 * MIB and trimmed < 4 * MIB  # left in the heap: why the thresholds are held


def test_a_c_library_without_glibcs_symbol_is_left_as_it_is(monkeypatch):
    class Musl:  # musl and macOS's libc have mallopt or not, but not gnu_get_libc_version
        def __getattr__(self, name):
            raise AttributeError(name)

    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: Musl())
    assert allocator.hold_malloc_thresholds() is False
