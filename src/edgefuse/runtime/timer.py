"""The one timer of edgefuse: programs timed against each other, alternating, medians over many rounds.

Every benchmark (``edgefuse bench``, ``edgefuse bench-llm``, ``python -m edgefuse.tools.xnnpack_bench``,
``llm_latency``, ``pass_time``) times through :func:`alternate`, by these rules:

- a round runs each task once; no program runs twice in a row, across the end of a round too, so with
  two programs (stock and edgefuse) they strictly alternate, and a change of machine load hits both;
  with more tasks the order is shuffled afresh each round (seeded, so a run can be repeated);
- the ``warmup`` rounds first are run and not kept;
- each call is read on the wall clock and in the process's CPU time (all its threads), in parts when a
  task marks them (a prefill, then decode steps); garbage collection is off while timing;
- a table shows each part's median over the kept rounds.

A timing means little without the machine it ran on: :func:`conditions` states the thread count and
the CPU's float16, bfloat16 and int8 features, read from ``/proc/cpuinfo`` (:func:`cpu_features`).
"""

from __future__ import annotations

import gc
import platform
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

#: The part a call is kept under when its task marks none.
WHOLE = "call"


@dataclass(frozen=True)
class Clock:
    """The clocks a timing reads, in nanoseconds: the wall clock, and the CPU time of the process."""

    wall_ns: Callable[[], int] = time.perf_counter_ns
    cpu_ns: Callable[[], int] = time.process_time_ns


@dataclass(frozen=True)
class Task:
    """One thing to time: ``run(mark)`` does it once, calling ``mark(part)`` at the end of each part it
    names (none: the whole call is one part); ``program`` says which program it runs, so that no program
    runs twice in a row."""

    program: Hashable
    run: Callable[[Callable[[str], None]], object]


@dataclass
class Samples:
    """One task's kept rounds: microseconds by part, on the wall clock and in CPU time."""

    wall_us: dict[str, list[float]] = field(default_factory=dict)
    cpu_us: dict[str, list[float]] = field(default_factory=dict)

    def median(self, part: str = WHOLE, cpu: bool = False) -> float:
        """The median microseconds of ``part``, on the wall clock or (``cpu``) in CPU time."""
        return statistics.median((self.cpu_us if cpu else self.wall_us)[part])


def round_orders(programs: Sequence[Hashable], rounds: int, seed: int = 0) -> list[list[int]]:
    """The order of the tasks (by index) in each round: every task once, no program twice in a row,
    across the end of a round too. Two tasks alternate strictly; more are shuffled (seeded) each round.
    :class:`ValueError` when one program has more than half of two or more tasks: no such order exists
    (a single task is allowed: it has nothing to alternate with)."""
    most = max(Counter(programs).values(), default=0)
    if len(programs) > 1 and 2 * most > len(programs):
        raise ValueError(f"one program has {most} of {len(programs)} tasks: it would run twice in a row")
    rng = random.Random(seed)
    orders: list[list[int]] = []
    previous = None
    for _ in range(rounds):
        order = list(range(len(programs)))
        while len(programs) > 2:
            rng.shuffle(order)
            ran = [previous] + [programs[k] for k in order]
            if all(a != b for a, b in zip(ran, ran[1:])):
                break
        orders.append(order)
        previous = programs[order[-1]]
    return orders


def alternate(tasks: Sequence[Task], rounds: int, warmup: int, clock: Clock = Clock(), seed: int = 0) -> list[Samples]:
    """Run ``warmup`` + ``rounds`` rounds of ``tasks`` in :func:`round_orders`; each task's kept samples."""
    samples = [Samples() for _ in tasks]
    orders = round_orders([task.program for task in tasks], warmup + rounds, seed)
    collecting = gc.isenabled()
    gc.disable()
    try:
        for number, order in enumerate(orders):
            for k in order:
                timed = _once(tasks[k], clock)
                if number >= warmup:
                    for part, (wall, cpu) in timed.items():
                        samples[k].wall_us.setdefault(part, []).append(wall / 1e3)
                        samples[k].cpu_us.setdefault(part, []).append(cpu / 1e3)
    finally:
        if collecting:
            gc.enable()
    return samples


def _once(task: Task, clock: Clock) -> dict[str, tuple[int, int]]:
    """One call of ``task``: the wall and CPU nanoseconds of each part it marked (or of the whole call)."""
    parts: dict[str, tuple[int, int]] = {}
    last = [clock.wall_ns(), clock.cpu_ns()]

    def mark(part: str) -> None:
        wall, cpu = clock.wall_ns(), clock.cpu_ns()
        parts[part] = (wall - last[0], cpu - last[1])
        last[:] = wall, cpu

    task.run(mark)
    if not parts:
        mark(WHOLE)
    return parts


def conditions(threads: int, cpuinfo: str | None = None, runtime: bool = True) -> str:
    """What a timing ran on: the thread count, the CPU's features (:func:`cpu_features`) and, for a timing of
    the runtime (``runtime``), the threads MKL gives its workers (:func:`edgefuse.runtime.blas.blas_threads`)."""
    from edgefuse.runtime.blas import blas_threads

    line = f"{threads} thread(s); CPU: {cpu_features(cpuinfo)}"
    blas = blas_threads() if runtime else ""
    return f"{line}; {blas}" if blas else line


#: The CPU features that decide how XNNPACK runs float16, bfloat16 and int8 work: (flag as Linux's
#: ``/proc/cpuinfo`` spells it, what a reader of a timing needs to know about it), on x86 and on Arm.
X86_FEATURES = (
    ("f16c", "F16C (float16 conversions)"),
    ("avx512_fp16", "AVX512-FP16 (float16 arithmetic)"),
    ("avx512_bf16", "AVX512-BF16 (bfloat16 dot products)"),
    ("amx_fp16", "AMX-FP16"),
    ("amx_bf16", "AMX-BF16"),
    ("avx512_vnni", "AVX512-VNNI (int8 dot products)"),
    ("avx_vnni", "AVX-VNNI (int8 dot products)"),
)
ARM_FEATURES = (
    ("fphp", "Arm FP16 scalar arithmetic"),
    ("asimdhp", "Arm FP16 vector arithmetic"),
    ("bf16", "Arm BF16"),
    ("asimddp", "Arm int8 dot products"),
    ("i8mm", "Arm int8 matrix multiply"),
)


def cpu_features(cpuinfo: str | None = None) -> str:
    """The CPU's model and which of its float16, bfloat16 and int8 features are present or absent, from
    ``/proc/cpuinfo`` (or the text given): a timing of float16 or bfloat16 programs means little without it."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return f"{platform.machine()}; features unknown (no /proc/cpuinfo)"
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())  # the first processor's
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    arm = "asimd" in flags
    model = fields.get("model name") or (
        f"Arm CPU implementer {fields.get('cpu implementer', '?')} part {fields.get('cpu part', '?')}" if arm
        else platform.machine())
    relevant = ARM_FEATURES if arm else X86_FEATURES
    present = [name for flag, name in relevant if flag in flags]
    absent = [name for flag, name in relevant if flag not in flags]
    return (f"{model}; has {', '.join(present) or 'none of the float16/bfloat16/int8 features'}; "
            f"lacks {', '.join(absent) or 'none'}")
