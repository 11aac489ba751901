"""Run ``.pte`` programs in the released ``executorch.runtime`` and time them against each other.

Every claim the command line makes about a lowered program (it loads, it matches eager, it is faster or
slower) is checked here, on the bytes that would ship, with the real XNNPACK kernels. The timing is the
benchmark machinery: the programs run alternately (one run of each, repeated) after a warm-up, so a
change of machine load hits all of them alike; the result is each program's median. It takes any
number of programs and inputs, so ``edgefuse.tools.xnnpack_bench`` can share it.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

from edgefuse.runtime.log import with_its_log, without_set_up_noise


@functools.cache
def start_threadpool() -> int:
    """Create the runtime's threadpool, once per process; returns the thread count it was created with.

    Creating it probes the CPU and logs five lines (``cpuinfo_utils.cpp``: "Reading file" and "Failed to
    open midr file" twice each, then "CPU info and manual query on # of cpus dont match") that say
    nothing about any program, so they are dropped.
    """
    from executorch.extension.pybindings import portable_lib

    with without_set_up_noise():
        return portable_lib._threadpool_get_thread_count()


class MethodMissing(ValueError):
    """A program has no method of the name asked for; ``methods`` are the ones it has."""

    def __init__(self, method: str, methods: Sequence[str]) -> None:
        self.method, self.methods = method, tuple(methods)
        super().__init__(f"the program has no method {method!r}; its methods: {', '.join(self.methods) or 'none'}")


class LoadedProgram:
    """One method of a loaded ``.pte`` (``forward`` unless named); holds the program, which must outlive
    its method.

    Loading and running raise errors that say what the runtime logged about the failure; a method the
    program lacks raises :class:`MethodMissing` naming the ones it has. With ``etdump=True`` the runtime
    records every run's profile (:meth:`etdump`)."""

    def __init__(self, pte: bytes, method: str = "forward", etdump: bool = False) -> None:
        from executorch.runtime import Runtime

        start_threadpool()
        self.program = with_its_log(lambda: Runtime.get().load_program(pte, enable_etdump=etdump))
        if method not in self.program.method_names:
            raise MethodMissing(method, sorted(self.program.method_names))
        self.method = with_its_log(lambda: self.program.load_method(method))

    def etdump(self) -> bytes:
        """The ETDump the runtime recorded since loading (load with ``etdump=True``): one run per
        ``execute``, each instruction's time, and each op's inside an XNNPACK delegate."""
        import os
        import tempfile

        with tempfile.TemporaryDirectory(prefix="edgefuse-etdump-") as folder:
            path = os.path.join(folder, "run.etdp")
            with_its_log(lambda: self.program.write_etdump_result_to_file(path, os.path.join(folder, "debug.bin")))
            with open(path, "rb") as f:
                return f.read()

    def run(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """The tensor outputs of one run."""
        import torch

        flat = _leaves(inputs)
        result = with_its_log(lambda: self.method.execute(flat))
        return [t for t in result if isinstance(t, torch.Tensor)]


def set_threads(threads: int) -> int:
    """Reset the runtime's threadpool to ``threads`` (before loading programs); returns the count it has.

    Also pins eager PyTorch to one thread: its OpenMP workers keep spinning after a run and slow the
    runtime down on a small machine.
    """
    import torch
    from executorch.extension.pybindings import portable_lib

    torch.set_num_threads(1)
    start_threadpool()
    with without_set_up_noise():  # "Resetting threadpool to N threads": the caller states the count
        portable_lib._unsafe_reset_threadpool(threads)
    return portable_lib._threadpool_get_thread_count()


#: The CPU features that decide how XNNPACK runs float16, bfloat16 and int8 work: (flag in /proc/cpuinfo,
#: what a reader of a timing needs to know about it), on x86 and on Arm.
_X86_FEATURES = (
    ("f16c", "F16C (float16 conversions)"),
    ("avx512fp16", "AVX512-FP16 (float16 arithmetic)"),
    ("avx512_bf16", "AVX512-BF16 (bfloat16 dot products)"),
    ("amx_bf16", "AMX-BF16"),
    ("amx_fp16", "AMX-FP16"),
    ("avx512_vnni", "AVX512-VNNI (int8 dot products)"),
    ("avx_vnni", "AVX-VNNI (int8 dot products)"),
)
_ARM_FEATURES = (
    ("asimdhp", "Arm FP16 arithmetic"),
    ("bf16", "Arm BF16"),
    ("asimddp", "Arm int8 dot products"),
    ("i8mm", "Arm int8 matrix multiply"),
)


def cpu_features(cpuinfo: str | None = None) -> str:
    """The CPU's model and which of its float16, bfloat16 and int8 features are present or absent, from
    ``/proc/cpuinfo`` (or the text given): a timing of float16 or bfloat16 programs means little without it."""
    import platform

    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return f"{platform.machine()}; features unknown (no /proc/cpuinfo)"
    model, flags = platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and model == platform.machine():
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    relevant = _ARM_FEATURES if "asimd" in flags else _X86_FEATURES
    present = [name for flag, name in relevant if flag in flags]
    absent = [name for flag, name in relevant if flag not in flags]
    return f"{model}; has {', '.join(present) or 'none of the float16/bfloat16/int8 features'}; lacks {', '.join(absent) or 'none'}"


@dataclass
class Timing:
    """Microsecond samples of one program; ``median`` is what a table shows."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def alternate(programs: Sequence[LoadedProgram], inputs: Sequence[Any], runs: int, warmup: int) -> list[Timing]:
    """Time each program ``runs`` times, alternating between them, after ``warmup`` untimed rounds."""
    flat = _leaves(inputs)
    samples: list[list[float]] = [[] for _ in programs]
    for i in range(warmup + runs):
        for k, program in enumerate(programs):
            start = time.perf_counter_ns()
            program.method.execute(flat)
            elapsed = time.perf_counter_ns() - start
            if i >= warmup:
                samples[k].append(elapsed / 1e3)
    return [Timing(s) for s in samples]


def _leaves(inputs: Sequence[Any]) -> list:
    """The tensors and values of ``inputs`` in the flat order a method takes them. torch is imported here,
    where a program runs, so that :mod:`edgefuse.runtime.files` imports without it."""
    from torch.utils import _pytree as pytree

    return list(pytree.tree_leaves(tuple(inputs)))
