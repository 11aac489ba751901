"""The property check: one mode and backend profile on cases exported side by side, and what it enforces.

For each case and each *check* (a mode and a backend profile, :data:`CHECKS`):

* no exception escapes ``recompose_rms_norm`` ("exception");
* the rewritten program runs and returns as many tensors ("broken-program");
* every output keeps eager's dtype ("dtype");
* every output matches eager within the tolerance :mod:`edgefuse.fuzz.tolerance` derives from the
  dtypes, or matches the unrewritten program where export itself already computes differently from
  eager (edge graphs decompose ``F.rms_norm``) ("mismatch");
* every rebuilt norm matches the decomposed norm it replaced, computed from the same values, within the
  tolerance of its own dtype (:mod:`edgefuse.fuzz.localize`), which catches a dropped rounding that a
  later rounding hides at the output ("norm-mismatch");
* a rebuilt norm normalizes the shape the case normalizes, with the case's eps as the graph may round
  it ("wrong-norm");
* a near miss is never rebuilt ("near-miss-rebuilt");
* every norm left decomposed has a reason ("no-reason").

An output difference that the model's own later ops magnified from allowed differences of the rebuilt
norms is recorded as *amplified*, not as a finding, only on the evidence :meth:`Replay.explains` asks for.

Decisions are attributed to cases by module path (``c3.norm``), or, where export left none (edge graphs
decompose ``F.rms_norm`` without one), by the graph input the norm's mean depends on; outputs by position.
"""

from __future__ import annotations

import copy
import traceback
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch.fx import GraphModule

import edgefuse
from edgefuse.fuzz.localize import Replay, norm_by_norm
from edgefuse.fuzz.render import Built
from edgefuse.fuzz.spec import CaseSpec, normalized_shape
from edgefuse.fuzz.tolerance import compare_at, eps_values, output_tolerance_dtypes
from edgefuse.core.recompose import UNREADABLE
from edgefuse.core.verify import outputs

#: (mode, backend, quantization_capture) in the order they run. Quantization capture is for captured
#: graphs only: the pass refuses it on edge graphs.
CHECKS: tuple[tuple[str, str, bool], ...] = (
    ("capture", "aten", False),
    ("capture", "qnn", False),
    ("capture", "qnn", True),
    ("edge", "aten", False),
    ("edge", "qnn", False),
    ("edge-no-dim-order", "aten", False),
    ("edge-no-dim-order", "qnn", False),
)


def check_name(check: tuple[str, str, bool]) -> str:
    mode, backend, capture = check
    return f"{mode}/{backend}" + ("+quantization-capture" if capture else "")


@dataclass
class Finding:
    """One broken property for one case under one check."""

    kind: str
    check: tuple[str, str, bool]
    detail: str
    spec: CaseSpec
    batch: tuple[CaseSpec, ...] = ()  # set when the finding shows only with these cases side by side
    tolerance: tuple = ()  # per output of the case: the dtype of its tolerance (None: the output's own)
    damage: tuple = ()  # hostile variants: what was done to the graph (see edgefuse.fuzz.hostile)

    @property
    def signature(self) -> str:
        """What makes two findings the same bug, for deduplication."""
        mode, backend, capture = self.check
        return f"{self.kind}|{mode}|{backend}{'+qc' if capture else ''}|{self.spec.norm.form}|{self.spec.near_miss}"


@dataclass
class CaseResult:
    """What happened to one case across the checks that ran on it."""

    spec: CaseSpec
    checks: list[tuple[str, str, bool]] = field(default_factory=list)
    rebuilt: int = 0  # rebuilt decisions, summed over checks
    left: int = 0
    findings: list[Finding] = field(default_factory=list)
    unexportable: str | None = None
    unattributed: int = 0  # decisions that name no case
    paired: int = 0  # rebuilt norms compared one by one with the decomposed norm they replaced
    unpaired: int = 0  # rebuilt norms that could not be (judged at the outputs alone)
    baseline_divergence: list[str] = field(default_factory=list)  # the unrewritten program differs from eager
    amplified: list[str] = field(default_factory=list)  # output differences the model magnified (see Replay)


class UnitFailure(Exception):
    """The unit as a whole failed a check; its cases are re-run one by one to find which."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


def _fresh_target(base, mode: str):
    """A new, rewritable copy of the exported graph: a GraphModule (capture) or an ExportedProgram."""
    return base.module() if mode == "capture" else copy.deepcopy(base)


class _Attribution:
    """Which case of a unit a decision belongs to."""

    def __init__(self, built: Built, original: GraphModule):
        self.built = built
        self.nodes = {n.name: n for n in original.graph.nodes}
        user_inputs = [n for n in original.graph.nodes if n.op == "placeholder"][-len(built.inputs) :]
        self.case_of_input = {}
        for k, sl in enumerate(built.input_slices):
            for j in range(sl.start, sl.stop):
                self.case_of_input[user_inputs[j].name] = k

    def case(self, decision) -> int | None:
        if len(self.built.prefixes) == 1:
            return 0
        path = decision.module_path
        if path is not None:
            head = path.split(".", 1)[0]
            if head.startswith("c") and head[1:].isdigit() and int(head[1:]) < len(self.built.prefixes):
                return int(head[1:])
        mean = self.nodes.get(decision.mean)
        if mean is None:
            return None
        cases, seen, work = set(), set(), [mean]
        while work:
            node = work.pop()
            if node in seen:
                continue
            seen.add(node)
            if node.name in self.case_of_input:
                cases.add(self.case_of_input[node.name])
            work.extend(node.all_input_nodes)
        return cases.pop() if len(cases) == 1 else None

    def owner(self, decision, k: int, spec: CaseSpec) -> str | None:
        """"norm" or "feed": which norm of case ``k`` the decision is.

        From the module path; without one (a decomposed ``F.rms_norm``), the case's one functional norm.
        """
        path = decision.module_path
        if path is not None:
            return path[len(self.built.prefixes[k]) :].split(".", 1)[0]
        return functional_norm(spec)


def functional_norm(spec: CaseSpec) -> str | None:
    """"norm" or "feed": the case's one norm written as ``F.rms_norm`` (the registry's ``functional``),
    whose decomposition may carry no module path; None when the case has none or two."""
    functional = [name for name, norm in (("norm", spec.norm), ("feed", spec.feed)) if norm is not None and norm.functional]
    return functional[0] if len(functional) == 1 else None


def run_check(
    specs: Sequence[CaseSpec],
    built: Built,
    eager: list[torch.Tensor],
    base,
    check: tuple[str, str, bool],
    results: list[CaseResult],
) -> None:
    """Run one check on a unit; record per-case counts and findings, or raise UnitFailure."""
    mode, backend, capture = check
    target = _fresh_target(base, mode)
    try:
        result = edgefuse.recompose_rms_norm(target, backend=backend, quantization_capture=capture)
    except Exception:
        raise UnitFailure("exception", "recompose_rms_norm raised:\n" + traceback.format_exc(limit=-6))
    rewritten = result.graph_module if mode == "capture" else target.module()
    try:
        actual = outputs(rewritten, built.inputs)
    except Exception:
        raise UnitFailure("broken-program", "the rewritten program no longer runs:\n" + traceback.format_exc(limit=-4))
    if len(actual) != len(eager):
        raise UnitFailure("broken-program", f"the rewritten program returns {len(actual)} tensors, eager {len(eager)}")

    original = base.module()
    attribution = _Attribution(built, original)
    per_case: list[list] = [[] for _ in specs]
    for decision in result.decisions:
        k = attribution.case(decision)
        if k is None:
            results[0].unattributed += 1
        else:
            per_case[k].append(decision)

    new = {d.node: d.mean for d in result.rebuilt if d.node}
    local = norm_by_norm(original, rewritten, new, built.inputs)
    tolerance = output_tolerance_dtypes(result.graph_module, set(new))
    baseline: list = []  # the unrewritten program's outputs, computed on the first mismatch

    def unrewritten() -> list[torch.Tensor]:
        if not baseline:
            baseline.extend(outputs(original, built.inputs))
        return baseline

    for k, (spec, res) in enumerate(zip(specs, results)):
        res.checks.append(check)
        first = len(res.findings)
        sl = built.output_slices[k]
        decisions = per_case[k]
        _check_decisions(spec, res, decisions, lambda d, k=k, spec=spec: attribution.owner(d, k, spec), check)
        nodes = {d.node for d in decisions if d.rebuilt and d.node}
        _check_norms(spec, res, nodes, local, check)
        _check_outputs(
            spec, res, decisions, eager[sl], actual[sl], tolerance[sl], check,
            lambda sl=sl: unrewritten()[sl],
            lambda i, sl=sl: local.explains(sl.start + i, nodes) if local is not None else None,
        )
        for finding in res.findings[first:]:
            finding.tolerance = tuple(tolerance[sl])


def _check_decisions(spec: CaseSpec, res: CaseResult, decisions: list, owner_of: Callable, check) -> None:
    """Counts; a near miss is never rebuilt, a rebuilt norm has the case's shape and eps, a left one a reason."""
    res.rebuilt += sum(d.rebuilt for d in decisions)
    res.left += sum(not d.rebuilt for d in decisions)
    for d in decisions:
        if not d.rebuilt:
            if not (isinstance(d.reason, str) and d.reason.strip()):
                res.findings.append(Finding("no-reason", check, f"a norm was left without a reason: {d}", spec))
            elif d.reason.startswith(UNREADABLE):  # the pass raised inside and caught it: a bug here
                res.findings.append(Finding("internal-error", check, f"the pass failed on an undamaged graph: {d}", spec))
            continue
        owner = owner_of(d)
        if owner == "norm" and spec.near_miss is not None:
            res.findings.append(Finding("near-miss-rebuilt", check, f"near miss {spec.near_miss!r} rebuilt: {d}", spec))
            continue
        norm, shape = (spec.norm, spec.norm_shape) if owner == "norm" else (spec.feed, spec.shape)
        if owner not in ("norm", "feed") or norm is None:
            continue
        want = normalized_shape(norm, shape)
        if tuple(d.normalized_shape or ()) != want:
            res.findings.append(
                Finding("wrong-norm", check, f"rebuilt over {d.normalized_shape}, the model normalizes {want}: {d}", spec)
            )
        if d.eps not in eps_values(norm, spec.dtype):
            res.findings.append(Finding("wrong-norm", check, f"rebuilt with eps {d.eps!r}, the model adds {norm.eps!r}: {d}", spec))


def _check_norms(spec: CaseSpec, res: CaseResult, nodes: set[str], local: Replay | None, check) -> None:
    """Each rebuilt norm of the case against the decomposed norm it replaced, from the same values."""
    for node in sorted(nodes):
        norm = local.norms.get(node) if local is not None else None
        if norm is None or norm.twin is None:
            res.unpaired += 1
            continue
        res.paired += 1
        if norm.ok:
            continue
        c = norm.comparison
        what = "NaN or inf where the other has a finite value" if c is None or c.max_error == float("inf") else (
            f"max error {c.max_error:.6g} > {c.allowed:.6g} allowed"
        )
        if norm.exact is not None:
            what += (
                f", and it is {norm.exact[0]:.6g} off the model's norm computed exactly (one ulp, "
                f"{norm.exact[1]:.6g}, allowed)"
            )
        res.findings.append(
            Finding(
                "norm-mismatch", check,
                f"the rebuilt {node} differs from {norm.twin}, the decomposed norm it replaced, computed from the "
                f"same values: {what} (tolerance in its own dtype)",
                spec,
            )
        )


def _check_outputs(spec, res, decisions, eager, actual, tolerance, check, unrewritten, explain) -> None:
    """Each output keeps eager's dtype and matches it (or the unrewritten program, where export already differs)."""
    for i, (expected, got, tol) in enumerate(zip(eager, actual, tolerance)):
        dtype = tol if tol is not None else expected.dtype
        comparison = compare_at(expected, got, dtype)
        if not comparison.dtype_ok:
            res.findings.append(Finding("dtype", check, f"output {i} is {got.dtype}, eager gives {expected.dtype}", spec))
            continue
        if comparison.ok:
            continue
        # Export itself may compute differently from eager (edge decomposes F.rms_norm): then the pass
        # is judged against the program it was given.
        before_value = unrewritten()[i]
        before = compare_at(expected, before_value, dtype)
        if not before.ok:
            res.baseline_divergence.append(
                f"{check_name(check)} output {i}: the unrewritten program differs from eager by {before.max_error:.6g}"
            )
            comparison = compare_at(before_value, got, dtype)
            if comparison.ok:
                continue
        why = explain(i)
        if why is not None:
            res.amplified.append(f"{check_name(check)} output {i}: {comparison.max_error:.3g} > {comparison.allowed:.3g}: {why}")
            continue
        rebuilt = "; ".join(f"{d.module_path} as {d.form} in {d.dtype} eps={d.eps} on {d.input}" for d in decisions if d.rebuilt)
        if comparison.max_error == float("inf"):
            what = "NaN or inf where the reference has a finite value, or the reverse"
        else:
            what = f"max error {comparison.max_error:.6g} > {comparison.allowed:.6g} allowed"
        res.findings.append(
            Finding(
                "mismatch",
                check,
                f"output {i} ({expected.dtype}, tolerance in {dtype}): {what}"
                + ("" if before.ok else " (against the unrewritten program)")
                + f"; rebuilt: {rebuilt or 'nothing'}",
                spec,
            )
        )


def merge(into: CaseResult, other: CaseResult) -> None:
    """Add ``other``'s checks, counts and findings (the same case, re-run alone) to ``into``."""
    into.checks += other.checks
    into.rebuilt += other.rebuilt
    into.left += other.left
    into.findings += other.findings
    into.unattributed += other.unattributed
    into.paired += other.paired
    into.unpaired += other.unpaired
    into.baseline_divergence += other.baseline_divergence
    into.amplified += other.amplified
    into.unexportable = into.unexportable or other.unexportable
