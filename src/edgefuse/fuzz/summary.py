"""What a run found, counted, and the text it prints at the end."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgefuse.fuzz.check import CHECKS, CaseResult, Finding, check_name
from edgefuse.fuzz.units import UnitTimes

#: The kinds of finding that make a run fail, and how the summary names them.
FAILING = {
    "mismatch": "mismatches at the outputs",
    "norm-mismatch": "rebuilt norms unlike the norm they replaced",
    "dtype": "changed output dtypes",
    "broken-program": "broken programs",
    "wrong-norm": "wrong norm parameters",
    "exception": "exceptions",
    "internal-error": "norms left because the pass failed to read an undamaged graph",
    "near-miss-rebuilt": "near-misses rebuilt",
    "no-reason": "norms left without a reason",
    "hostile-exception": "exceptions on hostile graphs",
    "hostile-mismatch": "mismatches on hostile graphs",
    "hostile-no-reason": "norms left without a reason on hostile graphs",
    "xnnpack-exception": "XNNPACK lowerings that raised",
    "xnnpack-broken": "XNNPACK programs that do not run",
    "xnnpack-mismatch": "XNNPACK mismatches",
    "fuzzer-error": "errors of the fuzzer itself",
}


@dataclass
class Summary:
    options: Any  # runner.Options
    generated: int = 0
    results: list[CaseResult] = field(default_factory=list)
    xnnpack_results: list[CaseResult] = field(default_factory=list)
    hostile_findings: list[Finding] = field(default_factory=list)
    hostile_cases: int = 0
    hostile_variants: Counter = field(default_factory=Counter)
    malformed_checked: int = 0
    malformed_failures: list[str] = field(default_factory=list)
    coverage: Counter = field(default_factory=Counter)
    elapsed: float = 0.0
    timing: UnitTimes = field(default_factory=UnitTimes)
    written: list[Path] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.results + self.xnnpack_results for f in r.findings] + self.hostile_findings

    def count(self, *kinds: str) -> int:
        return sum(f.kind in kinds for f in self.findings)

    @property
    def failed(self) -> bool:
        return bool(self.malformed_failures) or any(f.kind in FAILING for f in self.findings)

    def checks_by_mode(self) -> Counter:
        out: Counter = Counter()
        for r in self.results:
            out.update(check_name(c) for c in r.checks)
        return out


def duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _rows(summary: Summary) -> list[tuple[str, str]]:
    o = summary.options
    results = summary.results
    near = [r for r in results if r.spec.near_miss]
    edge_cases = sum(any(c[0] != "capture" for c in r.checks) for r in results)
    by_mode = summary.checks_by_mode()
    order = [check_name(c) for c in CHECKS]
    mismatches = summary.count("mismatch", "norm-mismatch")
    rows = [
        ("generated", f"{summary.generated} cases (seed {o.seed}, cases {o.start}..{o.start + o.cases - 1})"),
        ("checked", f"{sum(by_mode.values())} case x mode x backend checks: "
         + ", ".join(f"{name} {n}" for name, n in sorted(by_mode.items(), key=lambda kv: order.index(kv[0])))),
        ("edge modes", f"on {edge_cases} of {summary.generated} cases"
         + ("" if o.edge_every == 1 else f" (every case whose index is a multiple of {o.edge_every}; the rest: capture only)")),
        ("rebuilt", f"{sum(r.rebuilt for r in results)} norm decisions over all checks; "
         f"{sum(r.rebuilt > 0 for r in results)} cases had a norm rebuilt in at least one check"),
        ("left", f"{sum(r.left for r in results)} norm decisions left decomposed, each with a reason"),
        ("mismatches", f"{mismatches}" + (f" ({summary.count('mismatch')} at the outputs, "
                                           f"{summary.count('norm-mismatch')} norm by norm)" if mismatches else "")),
        ("exceptions", f"{summary.count('exception')} escaped; {summary.count('internal-error')} caught inside the "
         "pass on undamaged graphs (a norm left with 'could not read this graph')"),
        ("near-misses rebuilt", f"{summary.count('near-miss-rebuilt')} (of {len(near)} near-miss cases)"),
        ("changed dtypes", str(summary.count("dtype"))),
        ("broken programs", str(summary.count("broken-program"))),
        ("wrong norm params", str(summary.count("wrong-norm"))),
        ("left, no reason", str(summary.count("no-reason"))),
        ("norm by norm", f"{sum(r.paired for r in results)} rebuilt norms compared with the decomposed norm they "
         f"replaced, on the same values; {sum(r.unpaired for r in results)} could not be (judged at the outputs)"),
        ("unexportable", f"{sum(r.unexportable is not None for r in results)} cases (export or to_edge failed on the "
         "generated module, a limit of torch.export or ExecuTorch listed below; no check of the pass ran on them "
         "in that mode)"),
    ]
    if summary.xnnpack_results:
        xs = summary.xnnpack_results
        ran = [r for r in xs if r.checks]
        rows.append(("xnnpack sample", f"{len(ran)} cases lowered with edgefuse, run in executorch.runtime: "
                     f"{summary.count('xnnpack-mismatch')} mismatches, {summary.count('xnnpack-exception')} lowering "
                     f"exceptions, {summary.count('xnnpack-broken')} programs that do not run; "
                     f"{sum(r.unexportable is not None for r in xs)} that stock cannot lower or run either"))
    if summary.hostile_cases:
        variants = ", ".join(f"{k} {v}" for k, v in sorted(summary.hostile_variants.items()))
        rows.append(("hostile graphs", f"{summary.hostile_cases} cases ({variants}): "
                     f"{summary.count('hostile-exception')} exceptions, {summary.count('hostile-mismatch')} mismatches, "
                     f"{summary.count('hostile-no-reason')} norms left without a reason"))
    if summary.malformed_checked:
        rows.append(("malformed graphs", f"{summary.malformed_checked} graph x backend checks: "
                     f"{len(summary.malformed_failures)} failures"))
    if summary.count("fuzzer-error"):
        rows.append(("fuzzer errors", str(summary.count("fuzzer-error"))))
    baseline = sum(bool(r.baseline_divergence) for r in results)
    if baseline:
        rows.append(("export divergence", f"{baseline} cases where the unrewritten program already differs from eager "
                     "(the pass was judged against the unrewritten program there)"))
    amplified = [r for r in results if r.amplified]
    if amplified:
        rows.append(("amplified", f"{sum(len(r.amplified) for r in amplified)} output differences in {len(amplified)} "
                     "cases beyond the tolerance, each from rebuilt norms within 2 ulps of the norms they replaced "
                     "(or, for a norm computed wholly in its dtype, within one ulp of the model's norm computed "
                     "exactly) that the model's own later ops magnified (the original graph fed the rebuilt values gives the "
                     "rewritten output bit for bit)"))
    unattributed = sum(r.unattributed for r in results)
    if unattributed:
        rows.append(("unattributed", f"{unattributed} decisions named no case"))
    t = summary.timing
    rate = summary.generated / summary.elapsed if summary.elapsed else 0.0
    rows.append(("time", f"{summary.elapsed:.0f}s, {rate:.2f} cases/s (export {t.export:.0f}s, to_edge {t.to_edge:.0f}s, "
                 f"rewrite+run+compare {t.checks:.0f}s, xnnpack {t.xnnpack:.0f}s, hostile {t.hostile:.0f}s)"))
    return rows


def format_summary(summary: Summary) -> str:
    """The counts a run prints at the end, then the failing findings, unexportable cases and files."""
    rows = _rows(summary)
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    failing = [f for f in summary.findings if f.kind in FAILING]
    if failing or summary.malformed_failures:
        lines += ["", "failing findings:"]
        seen: Counter = Counter()
        for f in failing:
            seen[f.signature] += 1
            if seen[f.signature] <= 3:
                text = f.detail.strip().splitlines()[-1] if "exception" in f.kind or f.kind == "fuzzer-error" else f.detail
                lines.append(f"  {f.kind} {f.spec.name} {check_name(f.check)}: {text[:300]}")
        lines += [f"  ... {n - 3} more of {sig}" for sig, n in seen.items() if n > 3]
        lines += [f"  malformed: {text.strip().splitlines()[-1][:300]}" for text in summary.malformed_failures]
    unexportable = [r for r in summary.results if r.unexportable is not None]
    if unexportable:
        reasons = Counter(r.unexportable.split(":")[0] + ": " + r.unexportable.split(":", 1)[1][:90] for r in unexportable)
        lines += ["", "unexportable:"] + [f"  {n} x {reason}" for reason, n in reasons.most_common(5)]
    options = summary.options
    if options.out is not None and len(failing) > len([p for p in summary.written if not p.stem.endswith("-min")]):
        lines.append(f"(reproducers are written for the first {options.max_files} failing findings: --max-files)")
    notes = [(r.spec.name, n) for r in summary.results for n in r.baseline_divergence]
    if notes:
        lines += ["", "export divergence (first 3):"] + [f"  {name}: {note[:200]}" for name, note in notes[:3]]
    if summary.written:
        lines += ["", f"reproducers written: {len(summary.written)} in {options.out}"]
        lines += [f"  {p}" for p in summary.written[:20]]
    lines += ["", "result: " + ("FAIL" if summary.failed else "OK (no mismatches, exceptions or rebuilt near-misses)")]
    return "\n".join(lines)
