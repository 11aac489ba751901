"""MKL's threads in the kernels a timed program runs outside its delegates.

In the Python runtime, ExecuTorch's optimized and LLM kernels call PyTorch's MKL (linked into
``libtorch_cpu``): the custom SDPA of export_llm's programs runs its matrix-vector products on the
runtime's pool workers, where MKL opens OpenMP teams of its default size (one thread per core), whose
threads then spin beside XNNPACK's. ``torch.set_num_threads`` sets MKL's count for the calling thread only,
and MKL reads ``MKL_NUM_THREADS`` once, when torch loads. On a 2-core x86 machine, Qwen3-0.6B in 8da4w at 2
threads after a 128-token prompt took 57 to 65 ms a decode step in a process that had done no MKL work
before (the attention kernel 34 ms of it), 29 to 30 ms after one eager matrix product, and 24 to 25 ms with
``MKL_NUM_THREADS=1`` set before torch loaded; set after torch had loaded, it changed nothing. A C++ runner
has no such second pool. So the timing commands pin MKL to one thread before torch loads, and each
timing's conditions line says how many threads MKL gives the runtime's workers. The variable also sets
torch's own default thread count to one in that process and its children (eager work there runs on one
thread, as the timing children already pin it).
"""

from __future__ import annotations

import os
import sys

#: The variable MKL reads its thread count from.
VARIABLE = "MKL_NUM_THREADS"


def pin_blas_threads() -> None:
    """Ask MKL for one thread unless the environment already gives it a count; only before torch loads,
    since MKL reads the variable then (an empty value counts as none, as MKL reads it)."""
    if "torch" not in sys.modules and not os.environ.get(VARIABLE, "").strip():
        os.environ[VARIABLE] = "1"


def mkl_threads() -> int | None:
    """The threads MKL gives a thread that set no count of its own, as the runtime's pool workers are:
    asked of PyTorch's MKL from a fresh thread (the calling thread may have set its own). None when this
    torch has no MKL, 0 when its MKL cannot be asked."""
    import ctypes
    import threading

    import torch

    if not torch.backends.mkl.is_available():
        return None
    try:  # the library torch has already loaded, found by its name
        ask = ctypes.CDLL("libtorch_cpu.so", mode=getattr(os, "RTLD_NOLOAD", 0)).mkl_get_max_threads
    except (OSError, AttributeError):  # another platform's build, or MKL linked another way
        return 0
    answer: list[int] = []
    worker = threading.Thread(target=lambda: answer.append(int(ask())))
    worker.start()
    worker.join()
    return answer[0]


def blas_threads() -> str:
    """What MKL gives the runtime's workers, for a timing's conditions line ("" without MKL)."""
    count = mkl_threads()
    if count is None:
        return ""
    if count == 0:
        return "MKL threads unknown (its library could not be asked)"
    if count == 1:
        return "MKL 1 thread in the runtime's workers"
    return (f"MKL {count} threads in the runtime's workers ({VARIABLE}=1 was not set before torch loaded): its "
            "OpenMP threads can run beside the runtime's pool and slow times at 2 threads or more")
