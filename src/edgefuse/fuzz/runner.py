"""A fuzz run: generate cases, check them in units, count, and write reproducers for what fails."""

from __future__ import annotations

import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence, TextIO

from edgefuse.fuzz.check import CHECKS, CaseResult, Finding, check_name
from edgefuse.fuzz.generate import features, generate
from edgefuse.fuzz.edge_programs import cached_cia_ops
from edgefuse.fuzz.summary import FAILING, Summary, duration
from edgefuse.fuzz.units import UnitTimes, run_unit

CAPTURE_CHECKS = tuple(c for c in CHECKS if c[0] == "capture")
#: Where reproducer files go unless ``--out`` says otherwise; created only when a case fails.
DEFAULT_OUT = Path("edgefuse-fuzz-failures")


@dataclass
class Options:
    seed: int = 0
    cases: int = 100
    start: int = 0
    batch: int = 8
    edge_every: int = 1  # edge modes on cases whose index is a multiple of this (1: every case)
    hostile_every: int = 0  # damaged variants on cases whose index is a multiple of this (0: none)
    xnnpack_every: int = 0  # the XNNPACK flow on cases whose index is a multiple of this (0: none)
    malformed: bool = False  # also the fixed malformed graphs, once
    jobs: int = 1
    out: Path | None = DEFAULT_OUT
    shrink: int = 5  # shrink the first finding of this many distinct signatures
    max_files: int = 100
    progress_seconds: float = 30.0


def _quiet_pytree_deprecation() -> None:
    """Silence torch 2.13's FutureWarning about ``LeafSpec``, raised by every deepcopy of an exported
    program: it says nothing about the cases, and thousands of copies would bury the run's own lines."""
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


def _every(index: int, k: int) -> bool:
    return k > 0 and index % k == 0


def _edge_may_fail(spec) -> bool:
    """Whether ``to_edge`` is known to fail on the case: ExecuTorch 1.5.1 maps no 5-D channels-last dim
    order to a memory format, so a cast of such a tensor fails in ``_to_dim_order_copy``."""
    return spec.channels_last and len(spec.shape) == 5


def _unit_jobs(options: Options) -> list[tuple[list[int], tuple]]:
    """The units of the run: consecutive case indices, split by which checks they get.

    A case ``to_edge`` is known to fail on gets a unit of its own, so that its failure does not make the
    cases beside it re-run one by one.
    """
    units = []
    first, last = options.start, options.start + options.cases
    for i in range(first, last, options.batch):
        indices = list(range(i, min(i + options.batch, last)))
        full = [j for j in indices if _every(j, options.edge_every)]
        alone = [j for j in full if _edge_may_fail(generate(options.seed, j))]
        full = [j for j in full if j not in alone]
        light = [j for j in indices if not _every(j, options.edge_every)]
        if full:
            units.append((full, CHECKS))
        units += [([j], CHECKS) for j in alone]
        if light:
            units.append((light, CAPTURE_CHECKS))
    return units


@dataclass
class UnitOutcome:
    results: list[CaseResult]
    hostile: list
    xnnpack: list[CaseResult]
    timing: UnitTimes


def _work(seed: int, indices: Sequence[int], checks: tuple, hostile_every: int, xnnpack_every: int) -> UnitOutcome:
    """Everything the run does for one unit (in a worker process when ``--jobs`` > 1)."""
    _quiet_pytree_deprecation()
    specs = [generate(seed, j) for j in indices]
    timing = UnitTimes()
    hostile, xnnpack = [], []
    with cached_cia_ops():
        results = run_unit(specs, checks, timing)
        sampled = [s for s in specs if _every(s.index, xnnpack_every)]
        if sampled:
            from edgefuse.fuzz.xnnpack import XNNPACK_CHECK, run_xnnpack

            try:
                xnnpack = run_xnnpack(sampled, timing)
            except Exception:  # noqa: BLE001  (a bug of the fuzzer: reported, and the run goes on)
                xnnpack = [_fuzzer_error(sampled[0], XNNPACK_CHECK)]
        for spec in specs:
            if _every(spec.index, hostile_every):
                from edgefuse.fuzz.hostile import HostileResult, run_hostile

                start = time.perf_counter()
                try:
                    hostile.append(run_hostile(spec))
                except Exception:  # noqa: BLE001
                    hostile.append(HostileResult(spec, findings=_fuzzer_error(spec, ("hostile", "all", False)).findings))
                timing.hostile += time.perf_counter() - start
    return UnitOutcome(results, hostile, xnnpack, timing)


def _fuzzer_error(spec, check) -> CaseResult:
    detail = "the fuzzer's own check raised:\n" + traceback.format_exc(limit=-6)
    return CaseResult(spec, findings=[Finding("fuzzer-error", check, detail, spec)])


def _work_star(args) -> UnitOutcome:
    return _work(*args)


def run(options: Options, log: TextIO = sys.stderr, on_unit: Callable[[Summary], None] | None = None) -> Summary:
    """Run ``options.cases`` cases; findings are in the summary, reproducers in ``options.out``."""
    _quiet_pytree_deprecation()
    summary = Summary(options)
    start = last_report = time.perf_counter()
    if options.malformed:
        from edgefuse.fuzz.malformed import run_malformed

        summary.malformed_checked, summary.malformed_failures = run_malformed()
    jobs = [
        (options.seed, indices, checks, options.hostile_every, options.xnnpack_every)
        for indices, checks in _unit_jobs(options)
    ]
    if options.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=options.jobs, mp_context=multiprocessing.get_context("spawn"))
        stream: Iterable[UnitOutcome] = pool.map(_work_star, jobs)
    else:
        pool = None
        stream = (_work(*job) for job in jobs)
    try:
        for outcome in stream:
            _add(summary, outcome)
            if options.out is not None:  # write reproducers as findings come, not only at the end
                new = [f for r in outcome.results + outcome.xnnpack for f in r.findings]
                new += [f for h in outcome.hostile for f in h.findings]
                _write_findings(summary, [f for f in new if f.kind in FAILING], log)
            if on_unit is not None:
                on_unit(summary)
            now = time.perf_counter()
            if now - last_report >= options.progress_seconds and summary.generated < options.cases:
                last_report = now
                rate = summary.generated / (now - start)
                eta = (options.cases - summary.generated) / rate if rate else float("inf")
                print(
                    f"  [{summary.generated:>{len(str(options.cases))}}/{options.cases}] {rate:.2f} cases/s, "
                    f"eta {duration(eta)}, failing findings {sum(f.kind in FAILING for f in summary.findings)}, "
                    f"unexportable {sum(r.unexportable is not None for r in summary.results)}",
                    file=log,
                    flush=True,
                )
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    summary.elapsed = time.perf_counter() - start
    if options.out is not None and summary.findings:
        summary.written += shrink_findings(summary, options.out, log)
    return summary


def _add(summary: Summary, outcome: UnitOutcome) -> None:
    summary.results += outcome.results
    summary.generated += len(outcome.results)
    for r in outcome.results:
        summary.coverage.update(features(r.spec))
    summary.xnnpack_results += outcome.xnnpack
    for h in outcome.hostile:
        summary.hostile_cases += 1
        summary.hostile_variants.update(h.variants)
        summary.hostile_findings += h.findings
    summary.timing.add(outcome.timing)


def _write_findings(summary: Summary, findings: list[Finding], log: TextIO) -> None:
    """One reproducer file per failing finding, up to ``max_files`` in the run."""
    from edgefuse.fuzz import reproducer

    options = summary.options
    for finding in findings:
        if finding.kind == "fuzzer-error":  # a bug of the fuzzer: the summary shows its traceback's last line
            continue
        if len(summary.written) >= options.max_files:
            return
        path = reproducer.write(options.out, finding, reproducer.reproducer_text(finding))
        summary.written.append(path)
        print(f"  {finding.kind} in {finding.spec.name} under {check_name(finding.check)}: {path}", file=log, flush=True)


def shrink_findings(summary: Summary, out: Path, log: TextIO) -> list[Path]:
    """A shrunk reproducer for the first finding of each distinct signature (up to ``options.shrink``)."""
    from edgefuse.fuzz import reproducer
    from edgefuse.fuzz.shrink import shrink

    written = []
    seen: set[str] = set()
    for finding in summary.findings:
        if finding.kind not in FAILING or finding.signature in seen or finding.batch:
            continue
        if finding.kind.startswith(("hostile", "xnnpack")) or finding.kind == "fuzzer-error":
            continue
        seen.add(finding.signature)
        if len(seen) > summary.options.shrink:
            break
        with cached_cia_ops():
            small = shrink(finding)
        if small is not finding:
            text = reproducer.reproducer_text(small, note="shrunk from this case")
            path = reproducer.write(out, finding, text, suffix="-min")
            written.append(path)
            print(f"  shrunk {finding.spec.name} ({finding.kind}, {check_name(finding.check)}): {path}", file=log, flush=True)
    return written
