"""MKL's threads in the kernels a timed program runs outside its delegates.

In the Python runtime, ExecuTorch's optimized and LLM kernels call PyTorch's MKL (linked into
``libtorch_cpu``): the custom SDPA of export_llm's programs runs its matrix-vector products on the
runtime's pool workers, where MKL opens OpenMP teams of its default size (one thread per core), whose
threads then spin beside XNNPACK's. ``torch.set_num_threads`` sets MKL's count for the calling thread only,
and MKL reads ``MKL_NUM_THREADS`` once, when torch loads. On a 2-core x86 machine, Qwen3-0.6B in 8da4w at 2
threads after a 128-token prompt took 57 to 65 ms a decode step that way (the attention kernel 34 ms of
it), and 24 to 25 ms with ``MKL_NUM_THREADS=1`` set before torch loaded; set after torch had loaded, it
changed nothing. A C++ runner has no such second pool. So the timing commands pin MKL to one thread
first, and each timing's conditions line says whether that took effect.
"""

from __future__ import annotations

import os
import sys

#: The variable MKL reads its thread count from.
VARIABLE = "MKL_NUM_THREADS"

#: Whether MKL_NUM_THREADS held a value before torch loaded, as far as this process knows: set in the
#: environment it started with, or by :func:`pin_blas_threads` before torch was imported.
_before_torch = [VARIABLE in os.environ]


def pin_blas_threads() -> bool:
    """Ask MKL for one thread, unless the environment already chose a count; True when the count in the
    environment is one MKL will read (torch not yet imported, or the count set from the start)."""
    if VARIABLE not in os.environ and "torch" not in sys.modules:
        os.environ[VARIABLE] = "1"
        _before_torch[0] = True
    return _before_torch[0]


def blas_threads() -> str:
    """What MKL was told, for a timing's conditions line."""
    value = os.environ.get(VARIABLE)
    if value is not None and _before_torch[0]:
        return f"MKL {value} thread(s) ({VARIABLE})"
    return (f"MKL threads not pinned ({VARIABLE} unset when torch loaded): its OpenMP threads run beside the "
            "runtime's pool, and times at 2 threads or more run slow")
