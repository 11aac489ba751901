"""The norm report: one row per candidate norm of a model, what edgefuse decided and how close it stays.

``build_report`` exports the model, recomposes its norms for a backend at a stage (the captured ATen
graph a quantizer sees, or the ExecuTorch edge program), runs the rewritten program and compares:

- each norm's output (the output of the module the norm belongs to) with the same module's output in
  eager (for a saved ``.pt2``, in the saved program, since there is no eager module);
- the program's outputs with the unrewritten program's: this is the check (``Report.ok``), since it
  isolates what edgefuse changed from what export and the edge decompositions already change. Each
  float output is compared at the "rewritten program" tolerance (:data:`edgefuse.core.verify.TOLERANCES`) in units of the coarsest dtype on any path from a rebuilt norm to
  it (:func:`edgefuse.core.verify.output_tolerance_dtypes`: a float16 norm read by float32 outputs moves a
  float16 rounding), else of its own dtype; other outputs must match exactly.

``to_json`` gives the machine form, documented by ``report.schema.json`` next to this file.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Iterable

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node
from torch.utils import _pytree as pytree

from edgefuse.core._fx import Recorder, dtype_name, module_paths
from edgefuse.inputs.errors import UsageError
from edgefuse.core.fresh import fresh, kept_state
from edgefuse.inputs.modelspec import ModelSpec, error_summary
from edgefuse.core.ops import Role, table_for
from edgefuse.core.programs import detached
from edgefuse.quant.facts import norm_key
from edgefuse.core.recompose import Decision, recompose_rms_norm
from edgefuse.console.tables import format_table
from edgefuse.core.verify import TOLERANCES, compare, max_error, output_tolerance_dtypes, outputs

SCHEMA_VERSION = 1
STAGES = ("capture", "edge")


@dataclass
class NormRow:
    """One candidate norm: the decision, where it is in the model and its error against the reference."""

    decision: Decision
    layer: str | None
    max_error: float | None
    #: How the norm was quantized (:class:`edgefuse.quant.NormQuantization`), with ``--quantize``.
    quantized: Any = None
    #: The QNN op the norm became in edgefuse's QNN program (``RmsNorm``, or the ops it stayed as), with
    #: ``--compile``.
    compiled: str | None = None
    #: Another norm has the same module path (one module computing two norms, or one norm module called
    #: twice): the row names its mean too, and its error is the module's output (its last call's).
    shared: bool = False

    @property
    def key(self) -> str:
        """The norm's name in the report and in quantization facts (:func:`edgefuse.quant.facts.norm_key`)."""
        return norm_key(self.decision.module_path, self.decision.mean, self.shared)

    def cells(self, quantized: bool = False, compiled: bool = False) -> list[object]:
        d = self.decision
        error = _error(self.max_error) + (" (module)" if self.shared and self.max_error is not None else "")
        cells = [
            self.layer, self.key, d.form, dtype_name(d.dtype) if d.dtype is not None else "-", "yes" if d.rebuilt else "no", d.input, error, d.reason,
        ]
        if quantized:
            cells.append(self.quantized.describe() if self.quantized is not None else "not found in the quantized graph")
        if compiled:
            cells.insert(len(cells) - 1 - quantized, self.compiled)  # before the reason, which runs long
        return cells


@dataclass
class Report:
    """Everything ``edgefuse report`` prints, for one model, backend, stage and dtype."""

    model: str
    kind: str
    dtype: torch.dtype | None
    backend: str
    stage: str
    reference: str  # "eager" or "program"
    rows: list[NormRow] = field(default_factory=list)
    output_error: float = 0.0  # rewritten program against the reference
    unrewritten_error: float = 0.0  # unrewritten program against the reference
    difference: float = 0.0  # rewritten against unrewritten program
    allowed: float = 0.0
    ok: bool = True
    quantization: str | None = None  # the scheme of ``--quantize`` (rows then say how each norm was quantized)
    #: Norms the graph already held as one ``rms_norm`` node (``torch.nn.RMSNorm`` or ``F.rms_norm``
    #: captured before ``to_edge`` decomposes them): nothing to rebuild, so they have no row.
    already_one_op: int = 0
    #: What ``--compile`` lowered with (``QNN SM8650 fp16``): rows then say the QNN op each norm became.
    compiled: str | None = None
    #: With ``--compile``: QNN RmsNorm ops in the compiled program (norms already one op count too).
    rms_norms: int = 0

    @property
    def rebuilt(self) -> list[NormRow]:
        return [r for r in self.rows if r.decision.rebuilt]

    @property
    def left(self) -> list[NormRow]:
        return [r for r in self.rows if not r.decision.rebuilt]


def build_report(
    spec: ModelSpec, backend: str = "qnn", stage: str = "edge", progress=None, program: ExportedProgram | None = None
) -> Report:
    """Export ``spec`` (unless ``program`` is its export), recompose its norms for ``backend`` at ``stage``
    and compare; see the module doc."""
    say = progress or (lambda _: None)
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    if program is None:
        say(f"exporting {spec.name}")
        program = spec.export()
    if stage == "capture":
        unrewritten = program.module()
        rewritten = program.module()
        say(f"recomposing the norms of the captured graph for {backend}")
        result = recompose_rms_norm(rewritten, backend=backend, quantization_capture=True)
    else:
        from executorch.exir import to_edge

        from edgefuse.core.edge import edge_compile_config

        say("converting to the ExecuTorch edge dialect")
        try:
            edge = to_edge(detached(program), compile_config=edge_compile_config()).exported_program()
        except Exception as error:  # noqa: BLE001  (ExecuTorch rejects the model before edgefuse runs)
            raise UsageError(
                f"ExecuTorch's to_edge rejects {spec.name}: {error_summary(error, spec.source)}; try --stage "
                "capture, which reports on the captured graph before to_edge"
            ) from error
        unrewritten = edge.module()
        say(f"recomposing the norms of the edge program for {backend}")
        result = recompose_rms_norm(edge, backend=backend)
        rewritten = edge.module()
    return compare_decisions(spec, result.decisions, unrewritten, rewritten, backend, stage, say)


def compare_decisions(
    spec: ModelSpec, decisions: list[Decision], unrewritten: GraphModule, rewritten: GraphModule,
    backend: str, stage: str, say=lambda _: None,
) -> Report:
    """Run the programs and the reference, and make the report of ``decisions``."""
    say("running the rewritten program and its reference")
    paths = sorted({d.module_path for d in decisions if d.module_path})
    inputs = spec.inputs
    if spec.module is not None:
        reference_name = "eager"
        expected, expected_at = _eager_with_module_outputs(spec.module, inputs, paths)
    else:
        reference_name = "program"  # the saved program itself, before to_edge changes anything
        saved = spec.program.module() if spec.program is not None else unrewritten
        expected, expected_at = _graph_with_module_outputs(saved, inputs, paths)
    actual, actual_at = _graph_with_module_outputs(rewritten, inputs, paths)
    before = outputs(unrewritten, inputs)

    rows = []
    per_path = Counter(d.module_path for d in decisions if d.module_path)
    for d in decisions:
        error = None
        if d.module_path in expected_at and d.module_path in actual_at:
            error = _max_error(expected_at[d.module_path], actual_at[d.module_path])
        rows.append(NormRow(d, layer_of(d.module_path), error, shared=per_path[d.module_path] > 1))

    report = Report(spec.name, spec.kind, spec.dtype, backend, stage, reference_name, rows)
    graphs = [m.graph for m in unrewritten.modules() if isinstance(m, GraphModule)]  # and the subgraphs of cond, ...
    report.already_one_op = sum(
        1 for graph in graphs for n in graph.nodes if table_for(graph).is_a(n, Role.RMS_NORM)
    )
    if len(actual) != len(before) or len(actual) != len(expected):
        report.ok, report.output_error = False, math.inf
        return report
    report.output_error = max((_max_error(e, a) or 0.0 for e, a in zip(expected, actual)), default=0.0)
    report.unrewritten_error = max((_max_error(e, b) or 0.0 for e, b in zip(expected, before)), default=0.0)
    dtypes = tolerance_dtypes(rewritten, decisions, len(actual))
    comparisons = [compare(b, a, ulps=TOLERANCES["rewritten program"].ulps, dtype=dtype) for b, a, dtype in zip(before, actual, dtypes)]
    if comparisons:
        # show the output that comes closest to (or goes furthest past) its tolerance
        worst = max(comparisons, key=lambda c: (not c.ok, _ratio(c.max_error, c.allowed)))
        report.difference, report.allowed = worst.max_error, worst.allowed
    report.ok = all(c.ok for c in comparisons)
    return report


def tolerance_dtypes(rewritten: GraphModule, decisions: list[Decision], count: int) -> list[torch.dtype | None]:
    """For each of the ``count`` tensor outputs of ``rewritten``, the dtype to compare it at (None: its own).

    The graph's output node may also hold values that are not tensors, which :func:`outputs` drops: so
    are their entries here. Should the two still disagree, every output is compared at its own dtype,
    the finer bound.
    """
    new = {d.node for d in decisions if d.rebuilt and d.node}
    dtypes = output_tolerance_dtypes(rewritten, new)
    output = next(n for n in rewritten.graph.nodes if n.op == "output")
    leaves = pytree.tree_leaves(list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]])
    dtypes = [d for d, leaf in zip(dtypes, leaves) if _tensor_valued(leaf)]  # one flattening: same length
    return dtypes if len(dtypes) == count else [None] * count


def _tensor_valued(leaf: object) -> bool:
    """Whether an output leaf is a node that produces a tensor (a node without metadata is taken to)."""
    return isinstance(leaf, Node) and isinstance(leaf.meta.get("val", None), (torch.Tensor, type(None)))


def _ratio(error: float, allowed: float) -> float:
    return error / allowed if allowed > 0 else (0.0 if error == 0 else math.inf)


def layer_of(path: str | None) -> str | None:
    """The layer a module path lies in: ``layers.1`` or ``encoder.block.0``; None outside any layer."""
    if not path:
        return None
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit() and 0 < i < len(parts) - 1:  # a numbered block the norm lies inside
            stack = [p for p in parts[:i - 1] if p in ("encoder", "decoder", "vision", "text")]
            return ".".join(stack + [parts[i - 1], part])
    return None


def add_quantization(report: Report, scheme: str, by_key: dict) -> None:
    """Record on each row how its norm was quantized under ``scheme``, from facts keyed by :attr:`NormRow.key`."""
    report.quantization = scheme
    for row in report.rows:
        row.quantized = by_key.get(row.key)


# --- running -------------------------------------------------------------------------------------------

def _eager_with_module_outputs(module: torch.nn.Module, inputs: tuple, paths: Iterable[str]):
    """The eager outputs and, for each module path, that module's (last) output tensor."""
    captured: dict[str, torch.Tensor] = {}
    handles = []
    for path in paths:
        try:
            sub = module.get_submodule(path)
        except AttributeError:
            continue

        def hook(_module, _args, output, path=path):
            if isinstance(output, torch.Tensor):
                captured[path] = output.detach().clone()

        handles.append(sub.register_forward_hook(hook))
    try:
        result = outputs(module, inputs)
    finally:
        for handle in handles:
            handle.remove()
    return result, captured


def _graph_with_module_outputs(gm: GraphModule, inputs: tuple, paths: Iterable[str]):
    """The outputs of a graph module and, for each module path, the tensor that module's code produced."""
    wanted = {node.name: path for path, node in module_outputs(gm, paths).items()}
    recorder = Recorder(gm, wanted, keep=_copy_of_tensor)  # a later in-place op may write the tensor
    flat = pytree.tree_leaves(fresh(tuple(inputs)))
    with torch.no_grad(), kept_state(gm):
        result = fresh(recorder.run(*flat))  # an output may be a buffer put back
    tensors = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
    return tensors, {wanted[name]: value for name, value in recorder.values.items() if value is not None}


def _copy_of_tensor(value: Any) -> torch.Tensor | None:
    return value.detach().clone() if isinstance(value, torch.Tensor) else None


def module_outputs(gm: GraphModule, paths: Iterable[str]) -> dict[str, Node]:
    """For each module path, the last node its code produced that something outside that module reads."""
    wanted = set(paths)
    members: dict[Node, set[str]] = {}
    for node in gm.graph.nodes:
        members[node] = module_paths(node) & wanted
    found: dict[str, Node] = {}
    for node in gm.graph.nodes:
        for path in members[node]:
            if any(path not in members.get(user, ()) for user in node.users):
                found[path] = node
    return found


def _max_error(expected: torch.Tensor, actual: torch.Tensor) -> float | None:
    if expected.shape != actual.shape:
        return None
    return max_error(expected, actual)


# --- presenting ----------------------------------------------------------------------------------------

HEADER = ("layer", "module", "form", "dtype", "rebuilt", "input", "max err", "reason")


def format_report(report: Report) -> str:
    """The terminal table: one row per norm, then the summary line."""
    quantized = report.quantization is not None
    compiled = report.compiled is not None
    dtype = dtype_name(report.dtype) if report.dtype is not None else "no float weights"
    norms = f"{len(report.rows)} norm{'s' if len(report.rows) != 1 else ''}"
    lines = [
        f"{report.model} ({dtype}), {report.stage} stage, backend {report.backend}: {norms}"
        + (f", quantized for {report.quantization}" if quantized else "")
    ]
    if report.rows:
        header = HEADER[:-1] + (("QNN op",) if compiled else ()) + HEADER[-1:] + (("quantized as",) if quantized else ())
        lines.append(format_table(header, [r.cells(quantized, compiled) for r in report.rows]))
    lines.append(summary_line(report))
    if quantized:
        lines.append(quantization_line(report))
    if compiled:
        lines.append(compile_line(report))
    return "\n".join(lines)


def compile_line(report: Report) -> str:
    """How many norms became one QNN RmsNorm in the compiled program, and what the rebuilt ones became."""
    one = sum(1 for r in report.rows if (r.compiled or "").startswith("RmsNorm"))
    rebuilt_not_one = [r.key for r in report.rebuilt if not (r.compiled or "").startswith("RmsNorm")]
    text = (f"compiled for {report.compiled}: {one} of {len(report.rows)} norms are one QNN RmsNorm; "
            f"{report.rms_norms} RmsNorm in the QNN program")
    if rebuilt_not_one:
        text += f"; rebuilt here but not one RmsNorm there: {', '.join(rebuilt_not_one)}"
    return text


def quantization_line(report: Report) -> str:
    """How many norms were quantized as one op, and the quantize/dequantize pairs all norms cost."""
    facts = [r.quantized for r in report.rows if r.quantized is not None]
    one_op = sum(1 for f in facts if f.how == "one op")
    missing = len(report.rows) - len(facts)
    return (
        f"quantized for {report.quantization}: {one_op} of {len(report.rows)} norms as one op; the norms cost "
        f"{sum(f.pairs for f in facts)} quantize/dequantize pairs"
        + (f"; {missing} not found in the quantized graph" if missing else "")
    )


def summary_line(report: Report) -> str:
    verdict = "within" if report.ok else "OUTSIDE"
    reasons = sorted({r.decision.reason for r in report.left})
    distinct = f" ({len(reasons)} distinct reason{'s' if len(reasons) != 1 else ''})" if reasons else ""
    left = f"{len(report.left)} left decomposed{distinct}"
    if report.already_one_op:
        n = report.already_one_op
        left += f", {n} already {'one rms_norm op' if n == 1 else 'rms_norm ops'}"
    return (
        f"{len(report.rebuilt)} of {len(report.rows)} norms rebuilt, {left}; max error against "
        f"{report.reference} {_error(report.output_error)} (unrewritten program {_error(report.unrewritten_error)}); "
        f"rewritten vs unrewritten {_error(report.difference)}, {verdict} the allowed {_error(report.allowed)}"
    )


def to_json(report: Report) -> dict:
    """The report as JSON data that validates against ``report.schema.json``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {
            "name": report.model, "kind": report.kind, "dtype": dtype_name(report.dtype) if report.dtype else None,
        },
        "backend": report.backend,
        "stage": report.stage,
        "reference": report.reference,
        "norms": [
            {
                "mean": r.decision.mean,
                "layer": r.layer,
                "module_path": r.decision.module_path,
                "form": r.decision.form,
                "dtype": dtype_name(r.decision.dtype) if r.decision.dtype else None,
                "rebuilt": r.decision.rebuilt,
                "reason": r.decision.reason,
                "input": r.decision.input,
                "weight": r.decision.weight,
                "eps": _number(r.decision.eps),
                "normalized_shape": list(r.decision.normalized_shape) if r.decision.normalized_shape else None,
                "node": r.decision.node,
                "max_error": _number(r.max_error),
                "quantized": _quantized_json(r.quantized) if report.quantization else None,
                **({"compiled": r.compiled} if report.compiled is not None else {}),
            }
            for r in report.rows
        ],
        "quantization": report.quantization,
        **({"compiled": {"target": report.compiled, "rms_norms": report.rms_norms}} if report.compiled is not None else {}),
        "summary": {
            "norms": len(report.rows),
            "rebuilt": len(report.rebuilt),
            "left": len(report.left),
            "already_one_op": report.already_one_op,
            "output_max_error": _number(report.output_error),
            "unrewritten_max_error": _number(report.unrewritten_error),
            "rewritten_vs_unrewritten": _number(report.difference),
            "allowed": _number(report.allowed),
            "ok": report.ok,
        },
    }


def _quantized_json(facts) -> dict | None:
    if facts is None:
        return None
    return {
        "how": facts.how,
        "ops": list(facts.ops),
        "pairs_in": facts.pairs_in,
        "pairs_inside": facts.pairs_inside,
        "pairs_out": facts.pairs_out,
        "pairs_constant": facts.pairs_constant,
    }


def schema() -> dict:
    """The JSON schema of :func:`to_json`'s output (``report.schema.json``)."""
    import json

    return json.loads(resources.files("edgefuse.compare").joinpath("report.schema.json").read_text())


def _number(value: float | None) -> float | None:
    """JSON has no NaN or infinity: those, and None, become null."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"
