"""Benchmark: stock ``XnnpackPartitioner`` against ``edgefuse.xnnpack.lower`` on RMSNorm workloads.

``python -m edgefuse.xnnpack.bench [--quick] [--threads N] [--runs N]``

Workloads, each in float32 and float16 at 1, 32 and 128 rows:

- ``rmsnorm``: Hugging Face Llama's RMSNorm (upcast to float32, normalize, cast back, weight) over 2048;
- ``rmsnorm+linear``: that norm, then a ``Linear(512, 512)``, over 512;
- ``blocks``: four pre-norm residual blocks ``x + Linear(RMSNorm(x))`` over 512.

Each workload is lowered both ways; both ``.pte`` files are loaded in the released
``executorch.runtime.Runtime`` with the threadpool reset to the stated thread count before loading, and
run alternately (one stock run, one edgefuse run, repeated) after a warm-up. The table gives, per
program, the delegates, the ops left outside them, the max error against eager in the workload's dtype,
the median wall-clock time, the ratio of the edgefuse median to the stock one (below 1 is faster), and
the same ratio of median process CPU times (robust to the machine being shared). At one row
the table also shows the edgefuse program under the ``delegate`` single-row policy, which is what the
default policy (:mod:`edgefuse.xnnpack.policy`) is chosen against. This is a measurement, not a test:
nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.export import export

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

from edgefuse.xnnpack.inspect import load_method, lowered_modules, ops_outside, to_pte
from edgefuse.xnnpack.lower import lower
from edgefuse.xnnpack.policy import DEFAULT_SINGLE_ROW_POLICY

EPS = 1e-6


class LlamaRMSNorm(nn.Module):
    """Hugging Face Llama's RMSNorm, as transformers 5 writes it."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(width))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(x.dtype)


class NormLinear(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = LlamaRMSNorm(width)
        self.linear = nn.Linear(width, width, bias=False)

    def forward(self, x):
        return self.linear(self.norm(x))


class Blocks(nn.Module):
    def __init__(self, width: int, count: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(NormLinear(width) for _ in range(count))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


WORKLOADS: dict[str, tuple[Callable[[int], nn.Module], int]] = {
    "rmsnorm": (LlamaRMSNorm, 2048),
    "rmsnorm+linear": (NormLinear, 512),
    "blocks": (Blocks, 512),
}


@dataclass
class Lowered:
    label: str
    delegates: int
    outside: list[str]
    method: object
    error: float


def _lower(label: str, module: nn.Module, x: torch.Tensor, expected: torch.Tensor, how) -> Lowered:
    manager = how(export(module, (x,)))
    delegates, outside = len(lowered_modules(manager)), ops_outside(manager)
    method = load_method(to_pte(manager))
    out = method.execute([x])[0]
    error = float((out.double() - expected.double()).abs().max())
    return Lowered(label, delegates, outside, method, error)


def _time(methods: list[Lowered], x: torch.Tensor, runs: int, budget: float) -> tuple[list[float], list[float], int]:
    """Median wall-clock and process-CPU microseconds of each method, runs alternating between them.

    At most ``runs`` timed rounds, fewer (never under 100) when a round is so slow that ``runs`` of them
    would take more than ``budget`` seconds; the count used is returned. The CPU time (all threads of
    this process) is reported next to the wall clock because the machine is shared: time spent
    descheduled lands in the wall clock of whichever program was running.
    """
    start = time.perf_counter()
    for lowered in methods:
        lowered.method.execute([x])
    round_time = time.perf_counter() - start
    runs = max(100, min(runs, int(budget / max(round_time, 1e-9))))
    warmup = runs // 10
    wall: list[list[float]] = [[] for _ in methods]
    cpu: list[list[float]] = [[] for _ in methods]
    for i in range(warmup + runs):
        for k, lowered in enumerate(methods):
            start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
            lowered.method.execute([x])
            elapsed, elapsed_cpu = time.perf_counter_ns() - start, time.process_time_ns() - start_cpu
            if i >= warmup:
                wall[k].append(elapsed / 1e3)
                cpu[k].append(elapsed_cpu / 1e3)
    return [statistics.median(s) for s in wall], [statistics.median(s) for s in cpu], runs


def _summary(ops: list[str]) -> str:
    if not ops:
        return "-"
    counts: dict[str, int] = {}
    for op in ops:
        short = op.split(".")[-2] if op.count(".") >= 1 else op
        counts[short] = counts.get(short, 0) + 1
    return ",".join(f"{n}x{name}" for name, n in counts.items())


def run(quick: bool, threads: int, runs: int, budget: float, out=sys.stdout) -> None:
    from executorch.extension.pybindings import portable_lib

    # Eager PyTorch (the reference outputs) leaves OpenMP workers spinning, which on 2 cores slowed every
    # runtime call here to about 8 ms; the reference needs no threads.
    torch.set_num_threads(1)
    portable_lib._unsafe_reset_threadpool(threads)
    actual = portable_lib._threadpool_get_thread_count()
    row_counts = (1, 32) if quick else (1, 32, 128)
    print(
        f"threads: {actual} (reset with _unsafe_reset_threadpool({threads}) before loading); "
        f"up to {runs} timed runs per program (column 'runs'; fewer when {runs} would take over "
        f"{budget:.0f}s) after a tenth as many warm-up runs, alternating; default single-row policy "
        f"{DEFAULT_SINGLE_ROW_POLICY!r}; ratio = edgefuse median / stock median (below 1 is faster)",
        file=out,
    )
    header = (
        f"{'workload':<15} {'dtype':<8} {'rows':>4} {'edgefuse policy':<17} {'deleg s/e':>9} "
        f"{'outside stock':<28} {'outside edgefuse':<18} {'err stock':>9} {'err edgefuse':>12} "
        f"{'runs':>5} {'stock us':>9} {'edgefuse us':>11} {'ratio':>6} {'cpu ratio':>9}"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for name, (build, width) in WORKLOADS.items():
        for dtype in (torch.float32, torch.float16):
            for count in row_counts:
                torch.manual_seed(0)
                module = build(width).to(dtype).eval()
                x = torch.randn(1, count, width).to(dtype)
                with torch.no_grad():
                    expected = module(x)
                stock = _lower("stock", module, x, expected,
                               lambda ep: to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]))
                variants = [DEFAULT_SINGLE_ROW_POLICY] + (["delegate"] if count == 1 else [])
                ours = [
                    _lower(policy, module, x, expected, lambda ep, p=policy: lower(ep, single_row=p))
                    for policy in variants
                ]
                times, cpu, used = _time([stock, *ours], x, runs, budget)
                for lowered, median, median_cpu in zip(ours, times[1:], cpu[1:]):
                    print(
                        f"{name:<15} {str(dtype).removeprefix('torch.'):<8} {count:>4} {lowered.label:<17} "
                        f"{stock.delegates:>4}/{lowered.delegates:<4} {_summary(stock.outside):<28} "
                        f"{_summary(lowered.outside):<18} {stock.error:>9.2e} {lowered.error:>12.2e} "
                        f"{used:>5} {times[0]:>9.1f} {median:>11.1f} {median / times[0]:>6.2f} {median_cpu / cpu[0]:>9.2f}",
                        file=out,
                        flush=True,
                    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgefuse.xnnpack.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 32 rows only, fewer runs")
    parser.add_argument("--threads", type=int, default=1, help="XNNPACK threadpool size (default 1)")
    parser.add_argument("--runs", type=int, default=None, help="most timed runs per program (default 1000, quick 200)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of timed runs per workload before runs are cut (default 4, quick 1.5)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    runs = args.runs if args.runs is not None else (200 if args.quick else 1000)
    if runs < 10:
        parser.error("--runs must be at least 10")
    start = time.monotonic()
    budget = args.budget if args.budget is not None else (1.5 if args.quick else 4.0)
    if budget <= 0:
        parser.error("--budget must be positive")
    run(args.quick, args.threads, runs, budget)
    print(f"done in {time.monotonic() - start:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
