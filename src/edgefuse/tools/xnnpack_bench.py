"""Benchmark: stock ``XnnpackPartitioner`` against ``edgefuse.xnnpack.lower`` on mean and RMSNorm workloads.

``python -m edgefuse.tools.xnnpack_bench [--quick] [--threads N] [--runs N] [--budget S] [--only W,...]``

Workloads, each in float32 and float16, following the shapes of the upstream change this replaces
(``XNNStaticMean``, whose benchmark used a ``1x128x2048`` RMSNorm, a 3-D last-dim mean, and four pre-norm
blocks at width 2048 for decode, 1 token, and prefill, 64 tokens):

- ``mean``: ``x.mean(-1, keepdim=True)`` over 2048, at 1, 32 and 128 rows;
- ``rmsnorm``: Hugging Face Llama's RMSNorm (upcast to float32, normalize, cast back, weight) over 2048,
  at 1, 32 and 128 rows;
- ``rmsnorm+linear``: that norm, then a ``Linear(512, 512)``, over 512, at 1, 32 and 128 rows;
- ``blocks``: four pre-norm residual blocks ``x + Linear(RMSNorm(x))`` over 2048, at 1 and 64 rows;
- ``blocks-512``: the same blocks over 512, at 1, 32 and 128 rows.

Each workload is exported once per row and lowered both ways (each lowering takes a ``detached`` program,
with its own constants dict); both ``.pte`` files are loaded in the released ``executorch.runtime.Runtime`` with the threadpool reset to the stated
thread count before loading.
Every timed round runs each program twice, in a fresh random order in which no program runs twice in a
row: once as a full call (``Method.execute(inputs)``: copy the input in, run, clone the outputs out)
and once as the program alone (run again on the inputs already in place, nothing copied). The full
call is what a Python user sees; its copies cost the same for both programs (at 128 rows of 2048
floats they are hundreds of microseconds) and pull every ratio toward 1, so the program alone is the
headline, as a C++ runner would time ``Method::execute``. Garbage collection is off while timing.

The table gives, per program, the delegates, the ops left outside them, the max error against eager in
the workload's dtype, the median process CPU time of the program alone for stock and edgefuse, and
three ratios of edgefuse to stock (below 1 is faster): the CPU-time ratio of the program alone
(``ratio``), the same for the wall clock (``wall``), and the CPU-time ratio of the full call
(``call``). CPU time is robust to the machine being shared (time spent descheduled lands in the wall
clock of whichever program was running), so read ``ratio`` and ``load`` (the 1-minute load average
when the row finished) together. For the blocks, ``floor`` is the time of the same blocks without their
norms (``x + Linear(x)``, lowered by stock) over stock's time: no lowering of the norms can go below it
(CPU time, and ``fwall`` on the wall clock, the one to read beside ``wall`` with several threads: there the
linears' threads share the work, so their CPU time does not shrink while their latency does).
At one row the table also shows the edgefuse program under the other measured single-row policy
(``auto`` against the default ``delegate``), which the default (:mod:`edgefuse.xnnpack.policy`) is
chosen against. This is a measurement, not
a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if __name__ == "__main__":  # run as a command: torchao and torch log warnings as they are imported below
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from edgefuse.runtime import LoadedProgram

from edgefuse.runtime.blas import pin_blas_threads
from edgefuse.runtime.threads import threads_problem


@dataclass(frozen=True)
class Workload:
    """A timed module, by the name of its class in :mod:`edgefuse.inputs.workloads` (built from its width),
    so that the table is read before torch is imported."""

    name: str
    build: str
    width: int
    rows: tuple[int, ...]
    quick_rows: tuple[int, ...]
    #: The class built from the workload's module: the part no norm lowering changes (timed as ``floor``).
    floor: Optional[str] = None


WORKLOADS: tuple[Workload, ...] = (
    Workload("mean", "LastDimMean", 2048, (1, 32, 128), (1, 32)),
    Workload("rmsnorm", "LlamaRMSNorm", 2048, (1, 32, 128), (1, 32)),
    Workload("rmsnorm+linear", "NormLinear", 512, (1, 32, 128), (1, 32)),
    Workload("blocks", "Blocks", 2048, (1, 64), (1,), floor="Linears"),
    Workload("blocks-512", "Blocks", 512, (1, 32, 128), (32,), floor="Linears"),
)


@dataclass
class TimedProgram:
    """One workload lowered one way and loaded: its delegates, the ops left outside, the loaded program to
    time, and its error against eager."""

    label: str
    delegates: int
    outside: list[str]
    loaded: LoadedProgram
    error: float


def _lower(label: str, program: ExportedProgram, x: torch.Tensor, expected: torch.Tensor, how) -> TimedProgram:
    """``program`` lowered by ``how`` (which lowers a detached copy, so one export serves every lowering of
    a row), loaded, and checked against ``expected``."""
    from edgefuse.core._fx import ops_outside
    from edgefuse.core.verify import max_error
    from edgefuse.runtime import LoadedProgram
    from edgefuse.xnnpack.inspect import lowered_modules, to_pte

    manager = how(program)
    delegates, outside = len(lowered_modules(manager)), ops_outside(manager)
    loaded = LoadedProgram(to_pte(manager))
    error = max_error(expected, loaded.run([x])[0])
    return TimedProgram(label, delegates, outside, loaded, error)


@dataclass
class Medians:
    """Median microseconds of one program: the program alone and the full call, CPU and wall clock."""

    run_cpu: float
    run_wall: float
    call_cpu: float
    call_wall: float


def _time(programs: list[TimedProgram], x: torch.Tensor, runs: int, budget: float) -> tuple[list[Medians], int]:
    """Medians of each program's program-alone and full-call times, with the one timer
    (:func:`edgefuse.runtime.timer.alternate`: no program twice in a row, the order shuffled each round).

    At most ``runs`` timed rounds, fewer (never under 100, or ``runs`` if less) when a round is so slow
    that ``runs`` of them would take more than ``budget`` seconds; the count used is returned. CPU time
    is the process's (all threads), so it stays right with a threadpool of several threads.
    """
    from edgefuse.runtime.timer import Task, alternate

    tasks = []
    for k, timed in enumerate(programs):
        tasks.append(Task(k, lambda mark, loaded=timed.loaded: loaded.execute([x])))
        tasks.append(Task(k, lambda mark, loaded=timed.loaded: loaded.run_again()))
    probe = alternate(tasks, rounds=1, warmup=0)
    round_seconds = sum(samples.median() for samples in probe) / 1e6
    runs = max(min(runs, 100), min(runs, int(budget / max(round_seconds, 1e-9))))
    samples = alternate(tasks, rounds=runs, warmup=max(3, runs // 10))
    result = [
        Medians(
            run_cpu=samples[2 * k + 1].median(cpu=True),
            run_wall=samples[2 * k + 1].median(),
            call_cpu=samples[2 * k].median(cpu=True),
            call_wall=samples[2 * k].median(),
        )
        for k in range(len(programs))
    ]
    return result, runs


def _summary(ops: list[str]) -> str:
    if not ops:
        return "-"
    counts: dict[str, int] = {}
    for op in ops:
        short = op.split(".")[-2] if op.count(".") >= 1 else op
        counts[short] = counts.get(short, 0) + 1
    return ",".join(f"{n}x{name}" for name, n in counts.items())


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def run(quick: bool, threads: int, runs: int, budget: float, only: Optional[list[str]] = None, out=sys.stdout) -> None:
    # Eager PyTorch (the reference outputs) leaves OpenMP workers spinning, which on 2 cores slowed every
    # runtime call here to about 8 ms; set_threads gives the reference one thread.
    import torch
    from torch.export import export

    from edgefuse.core._fx import dtype_name
    from edgefuse.inputs import workloads as modules
    from edgefuse.runtime import set_threads
    from edgefuse.runtime.timer import conditions
    from edgefuse.xnnpack.lowering import lower, lower_stock
    from edgefuse.xnnpack.policy import DEFAULT_SINGLE_ROW_POLICY

    actual = set_threads(threads)
    print(
        f"threads: {actual} (reset with _unsafe_reset_threadpool({threads}) before loading); "
        f"up to {runs} timed rounds per row (column 'runs'; fewer when {runs} would take over "
        f"{budget:g}s) after a tenth as many warm-up rounds, random order; default single-row policy "
        f"{DEFAULT_SINGLE_ROW_POLICY!r}; load average at start {_load()}",
        file=out,
    )
    print(conditions(actual), file=out)
    print(
        "stock/edgefuse us: median CPU time of the program alone; ratio = edgefuse / stock of that (below 1 "
        "is faster); wall: the same on the wall clock; call: CPU-time ratio of the full call with its input "
        "copy and output clone; floor, fwall: blocks without norms / stock, CPU time and wall clock",
        file=out,
    )
    header = (
        f"{'workload':<15} {'dtype':<8} {'rows':>4} {'edgefuse policy':<17} {'deleg s/e':>9} "
        f"{'outside stock':<28} {'outside edgefuse':<18} {'err stock':>9} {'err edgefuse':>12} "
        f"{'runs':>5} {'stock us':>9} {'edgefuse us':>11} {'ratio':>6} {'wall':>5} {'call':>5} {'floor':>5} "
        f"{'fwall':>5} {'load':>5}"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for workload in WORKLOADS:
        if only and workload.name not in only:
            continue
        for dtype in (torch.float32, torch.float16):
            for count in workload.quick_rows if quick else workload.rows:
                torch.manual_seed(0)
                module = getattr(modules, workload.build)(workload.width).to(dtype).eval()
                x = torch.randn(1, count, workload.width).to(dtype)
                with torch.no_grad():
                    expected = module(x)
                program = export(module, (x,))
                stock = _lower("stock", program, x, expected, lower_stock)
                other = "auto" if DEFAULT_SINGLE_ROW_POLICY == "delegate" else "delegate"
                variants = [DEFAULT_SINGLE_ROW_POLICY] + ([other] if count == 1 else [])
                ours = [
                    _lower(policy, program, x, expected, lambda ep, p=policy: lower(ep, single_row=p))
                    for policy in variants
                ]
                timed = [stock, *ours]
                if workload.floor is not None:
                    floor_module = getattr(modules, workload.floor)(module).eval()
                    with torch.no_grad():
                        floor_expected = floor_module(x)
                    timed.append(_lower("floor", export(floor_module, (x,)), x, floor_expected, lower_stock))
                medians, used = _time(timed, x, runs, budget)
                base = medians[0]
                floor = (f"{medians[-1].run_cpu / base.run_cpu:>5.2f} {medians[-1].run_wall / base.run_wall:>5.2f}"
                         if workload.floor is not None else f"{'-':>5} {'-':>5}")
                for lowered, m in zip(ours, medians[1:]):
                    print(
                        f"{workload.name:<15} {dtype_name(dtype):<8} {count:>4} {lowered.label:<17} "
                        f"{stock.delegates:>4}/{lowered.delegates:<4} {_summary(stock.outside):<28} "
                        f"{_summary(lowered.outside):<18} {stock.error:>9.2e} {lowered.error:>12.2e} "
                        f"{used:>5} {base.run_cpu:>9.1f} {m.run_cpu:>11.1f} {m.run_cpu / base.run_cpu:>6.2f} "
                        f"{m.run_wall / base.run_wall:>5.2f} {m.call_cpu / base.call_cpu:>5.2f} {floor} "
                        f"{os.getloadavg()[0]:>5.2f}",
                        file=out,
                        flush=True,
                    )
    print(f"load average at end {_load()}", file=out)


def main(argv: list[str] | None = None) -> int:
    description = __doc__.split("\n")[0].replace("``", "")
    parser = argparse.ArgumentParser(prog="python -m edgefuse.tools.xnnpack_bench", description=description)
    parser.add_argument("--quick", action="store_true", help="fewer rows and runs")
    parser.add_argument("--threads", type=int, default=1, help="XNNPACK threadpool size (default 1)")
    parser.add_argument("--runs", type=int, default=None, help="most timed rounds per row (default 1000, quick 200)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of timed rounds per row before rounds are cut (default 4, quick 1.5)")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated workloads to run (of {', '.join(w.name for w in WORKLOADS)})")
    args = parser.parse_args(argv)
    pin_blas_threads()
    problem = threads_problem(args.threads)
    if problem:
        parser.error(problem)
    runs = args.runs if args.runs is not None else (200 if args.quick else 1000)
    if runs < 10:
        parser.error("--runs must be at least 10")
    only = args.only.split(",") if args.only else None
    unknown = [name for name in only or [] if name not in {w.name for w in WORKLOADS}]
    if unknown:
        parser.error(f"unknown workloads {', '.join(unknown)}")
    budget = args.budget if args.budget is not None else (1.5 if args.quick else 4.0)
    if not 0 < budget < float("inf"):  # also NaN
        parser.error("--budget must be a positive number of seconds")
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()  # lowering warns on every export (FutureWarnings of torch's pytree): not the table's business
    start = time.monotonic()
    run(args.quick, args.threads, runs, budget, only)
    print(f"done in {time.monotonic() - start:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
