"""Measure the quantized flows on the tiny models and print the tables ``python -m edgefuse.tools.quant`` shows.

QNN (capture, annotate, calibrate, convert; the converted program runs in eager, since lowering needs
the Qualcomm SDK): per model and dtype, the norms annotated as one op, the quantize/dequantize pairs
per norm and the error against eager, for the norms not rebuilt (``none``), rebuilt by the released
pass inside ``QnnQuantizer`` (``stock``) and rebuilt by edgefuse (``edgefuse``). What recomposition
itself does is measured against ``casts`` (edgefuse's graph before it rebuilds: casts that change
nothing removed): each rebuilt norm's own error, and the logits' error against the exact model (the
same weights, computed in float64 throughout) input by input. The logits of a quantized model carry
the rounding of every quantized op; moving one norm's output by a fraction of a step flips roundings
downstream either way, so the logits compare input by input, and the norm's own error is what
recomposition is judged by.

XNNPACK (qs8 and 8da4w, lowered stock and with edgefuse, each ``.pte`` run in ``executorch.runtime``):
per model, delegates and means left outside them, and the error against eager.

Calibration covers every token id of the tiny models' vocabulary once (a permutation, cut into
sequences), so no embedding row is outside its calibrated range; errors are reported on those inputs
(rounding alone, with min/max observers) and on held-out random sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from edgefuse.core._fx import dtype_name, top_graph

#: The QNN flows each table row measures (see :data:`edgefuse.qnn.quantizer.RECOMPOSE_MODES`).
QNN_MODES = ("none", "stock", "casts", "edgefuse")

VOCAB = 128
FIRST_ID = 3  # ids 0..2 are pad/bos/eos in the tiny models


def calibration_inputs(example_inputs: Sequence[torch.Tensor], seed: int = 1) -> list[tuple[torch.Tensor, ...]]:
    """Sequences shaped like ``example_inputs`` that together hold every token id at least once."""
    gen = torch.Generator().manual_seed(seed)
    shape = example_inputs[0].shape
    per = int(math.prod(shape))
    count = math.ceil((VOCAB - FIRST_ID) / per)
    streams = []
    for _ in example_inputs:
        ids = torch.randperm(VOCAB - FIRST_ID, generator=gen) + FIRST_ID
        ids = torch.cat([ids, ids[: count * per - ids.numel()]])
        streams.append(ids.view(count, *shape))
    return [tuple(stream[i] for stream in streams) for i in range(count)]


def held_out_inputs(example_inputs: Sequence[torch.Tensor], count: int, seed: int = 2) -> list[tuple[torch.Tensor, ...]]:
    """``count`` random sequences shaped like ``example_inputs``."""
    gen = torch.Generator().manual_seed(seed)
    return [
        tuple(torch.randint(FIRST_ID, VOCAB, x.shape, generator=gen, dtype=x.dtype) for x in example_inputs)
        for _ in range(count)
    ]


@dataclass
class Errors:
    """Largest and root-mean-square absolute error of a program's outputs against a reference, and the
    largest per input (in input order, so two programs run on the same inputs compare input by input)."""

    max: float
    rms: float
    per_input: list[float] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.max:.4g}"


def errors(run: Callable[..., Any], reference: Callable[..., Any], inputs: Sequence[Sequence[Any]]) -> Errors:
    """Errors of ``run`` against ``reference`` over every input tuple (first output of each)."""
    largest, squares, count, per_input = 0.0, 0.0, 0, []
    with torch.no_grad():
        for args in inputs:
            expected = _first(reference(*args)).double()
            actual = _first(run(*args)).double()
            diff = (actual - expected).abs().nan_to_num(nan=math.inf)  # a NaN is as wrong as can be
            per_input.append(float(diff.max()))
            largest = max(largest, per_input[-1])
            squares += float((diff**2).sum())
            count += diff.numel()
    return Errors(largest, math.sqrt(squares / max(count, 1)), per_input)


def paired(ours: Errors, theirs: Errors) -> tuple[int, int]:
    """On how many inputs ``ours`` has the lower and on how many the higher largest error."""
    pairs = list(zip(ours.per_input, theirs.per_input, strict=True))
    return sum(a < b for a, b in pairs), sum(a > b for a, b in pairs)


def _first(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        return _first(value[0])
    raise TypeError(f"expected a tensor output, got {type(value).__name__}")


@dataclass
class QnnRow:
    """One model and dtype through the QNN flows (:data:`edgefuse.qnn.quantizer.RECOMPOSE_MODES`).

    Errors are against eager (the model in its dtype) and against ``exact`` (the same model computed
    in float64 throughout, :mod:`edgefuse.quant.exact`). ``rebuilt`` holds the keys of the norms the
    edgefuse flow quantized as an ``rms_norm``; ``own`` holds, for the ``casts`` and ``edgefuse`` flows
    and per norm key, the norm's own error (:func:`edgefuse.quant.diagnose.own_errors`).
    """

    model: str
    dtype: str
    norms: int = 0
    rebuilt: list[str] = field(default_factory=list)
    one_op: dict[str, int] = field(default_factory=dict)
    pairs: dict[str, list[int]] = field(default_factory=dict)
    calibration: dict[str, Errors] = field(default_factory=dict)
    held_out: dict[str, Errors] = field(default_factory=dict)
    held_out_exact: dict[str, Errors] = field(default_factory=dict)
    own: dict[str, dict[str, float]] = field(default_factory=dict)
    norms_only_exact: dict[str, Errors] = field(default_factory=dict)
    left: list[tuple[str, str]] = field(default_factory=list)
    per_norm: dict[str, dict[str, str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def qnn_row(model_name: str, dtype: torch.dtype, held_out: int = 16, say=lambda _: None, norms_only: bool = True,
            **options: Any) -> QnnRow:
    """Quantize one tiny model for QNN every way and measure each converted program.

    Per flow: the logits' error against eager over the calibration and the held-out inputs and against
    the exact model over the held-out ones, each norm's own error, and, with ``norms_only``, the logits'
    error against the exact model when only the norms are quantized (held-out inputs).
    """
    from edgefuse.inputs.models import build_model
    from edgefuse.quant.diagnose import norm_runs, own_errors
    from edgefuse.quant.exact import exact_module
    from edgefuse.qnn.quantizer import quantize_for_qnn

    module, example = build_model(model_name, dtype, 0)
    exact = exact_module(module)
    calibration = calibration_inputs(example)
    others = held_out_inputs(example, held_out)
    row = QnnRow(model_name, dtype_name(dtype))
    runs = {}
    for mode in QNN_MODES:
        say(f"QNN {model_name} {row.dtype} {mode}")
        try:
            result = quantize_for_qnn(module, example, calibration, recompose=mode, **options)
            row.norms = max(row.norms, len(result.norms))
            row.one_op[mode] = result.one_op
            row.pairs[mode] = [n.pairs for n in result.norms]
            for n in result.norms:
                row.per_norm.setdefault(n.key, {})[mode] = n.describe()
            if mode == "edgefuse":
                row.rebuilt = [n.key for n in result.norms if n.rebuilt]
                row.left = [(d.module_path or d.mean, d.reason) for d in result.decisions if not d.rebuilt]
            row.calibration[mode] = errors(result.converted, module, calibration)
            row.held_out[mode] = errors(result.converted, module, others)
            row.held_out_exact[mode] = errors(result.converted, exact, others)
            if mode in ("casts", "edgefuse"):
                runs[mode] = norm_runs(result.converted, module.get_submodule, calibration + others)
            if norms_only:
                say(f"QNN {model_name} {row.dtype} {mode}, only the norms quantized")
                alone = quantize_for_qnn(module, example, calibration, recompose=mode, only_norms=True, **options)
                row.norms_only_exact[mode] = errors(alone.converted, exact, others)
        except Exception as error:  # one failing flow must not hide the others
            row.failed[mode] = f"{type(error).__name__}: {error}"
    if len(runs) == 2:
        own = own_errors(runs["edgefuse"], runs["casts"])
        row.own = {"edgefuse": {k: e.ours for k, e in own.items()}, "casts": {k: e.theirs for k, e in own.items()}}
    return row


@dataclass
class OwnErrorChanges:
    """The norms edgefuse rebuilt, split by their own error against the same norm in the ``casts`` flow
    (the same graph, not rebuilt): lower, equal, higher (or not finite), or not measured in one of the
    two flows."""

    lower: list[str] = field(default_factory=list)
    same: list[str] = field(default_factory=list)
    higher: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        text = f"{len(self.lower)}/{len(self.same)}/{len(self.higher)}"
        return text + (f", {len(self.missing)} not measured" if self.missing else "")


def own_error_changes(row: QnnRow) -> OwnErrorChanges:
    """How each norm edgefuse rebuilt compares, by its own error, with the norm not rebuilt."""
    ours, theirs = row.own.get("edgefuse", {}), row.own.get("casts", {})
    changes = OwnErrorChanges()
    for key in row.rebuilt:
        if key not in ours or key not in theirs:
            changes.missing.append(key)
        elif not math.isfinite(ours[key]):
            changes.higher.append(key)
        elif ours[key] < theirs[key]:
            changes.lower.append(key)
        elif ours[key] == theirs[key]:
            changes.same.append(key)
        else:
            changes.higher.append(key)
    return changes


@dataclass
class XnnpackRow:
    """One model through one quantization scheme, lowered stock and with edgefuse."""

    model: str
    dtype: str
    scheme: str
    delegates: dict[str, int] = field(default_factory=dict)
    means_outside: dict[str, int] = field(default_factory=dict)
    casts_outside: dict[str, int] = field(default_factory=dict)
    error: dict[str, Errors] = field(default_factory=dict)
    error_exact: dict[str, Errors] = field(default_factory=dict)
    error_quantized: dict[str, Errors] = field(default_factory=dict)
    reference_error: Errors | None = None
    norms: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def xnnpack_row(model_name: str, dtype: torch.dtype, scheme: str, held_out: int = 15, say=lambda _: None) -> XnnpackRow:
    """Quantize one tiny model with ``scheme``, lower it both ways, run both ``.pte`` against eager, the
    exact model (float64 throughout) and the quantized eager module, on the example and ``held_out`` inputs."""
    from edgefuse.compare.stock_and_edgefuse import summarize
    from edgefuse.inputs.models import build_model
    from edgefuse.core.ops import EDGE, Role
    from edgefuse.xnnpack import quantizer as xnnpack
    from edgefuse.quant.exact import exact_module
    from edgefuse.runtime import LoadedProgram

    module, example = build_model(model_name, dtype, 0)
    exact = exact_module(module)
    row = XnnpackRow(model_name, dtype_name(dtype), scheme)
    inputs = [tuple(example)] + held_out_inputs(example, held_out)
    say(f"XNNPACK {model_name} {row.dtype} {scheme}: quantizing")
    quantized = xnnpack.quantize(scheme, module, example, calibration_inputs(example))
    row.norms = sorted({n.describe() for n in quantized.norms})
    row.reference_error = errors(quantized.module, module, inputs)
    program = xnnpack.export_quantized(quantized, example)
    for how in (xnnpack.STOCK, xnnpack.EDGEFUSE):
        say(f"XNNPACK {model_name} {row.dtype} {scheme}: lowering ({how}) and running")
        try:
            lowered = xnnpack.lower(program, how)
            summary = summarize(lowered, how)
            row.delegates[how] = summary.delegates
            row.means_outside[how] = sum(1 for op in summary.outside if op.startswith("mean"))
            top = top_graph(lowered).graph
            row.casts_outside[how] = sum(1 for n in top.nodes if EDGE.is_a(n, Role.CAST))
            loaded = LoadedProgram(lowered.to_executorch().buffer)
            run = lambda *args: loaded.run(args)[0]  # noqa: E731
            row.error[how] = errors(run, module, inputs)
            row.error_exact[how] = errors(run, exact, inputs)
            row.error_quantized[how] = errors(run, quantized.module, inputs)
        except Exception as error:
            row.failed[how] = f"{type(error).__name__}: {error}"
    return row


def _pairs(values: list[int] | None) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def _err(errors: dict[str, Errors], mode: str) -> str:
    e = errors.get(mode)
    return "-" if e is None else f"{e.max:.3g}"


def _change(values: dict[str, Errors], baseline: str) -> str:
    """``baseline -> edgefuse`` largest errors, and on how many inputs edgefuse's is lower and higher."""
    if baseline not in values or "edgefuse" not in values:
        return "-"
    lower, higher = paired(values["edgefuse"], values[baseline])
    return f"{_err(values, baseline)} -> {_err(values, 'edgefuse')} ({lower}/{higher})"


def qnn_tables(rows: Sequence[QnnRow]) -> str:
    """The QNN tables as text: how the norms were quantized, then the errors (cells read in the order
    the header gives)."""
    from edgefuse.console.tables import format_table

    shown = ("none", "stock", "edgefuse")
    layout = ["model", "dtype", "norms", "rebuilt", "one op (stock, edgefuse)",
              "q/dq pairs per norm none / stock / edgefuse"]
    body = [[r.model, r.dtype, str(r.norms), str(len(r.rebuilt)),
             f"{r.one_op.get('stock', '-')}, {r.one_op.get('edgefuse', '-')}",
             " / ".join(_pairs(r.pairs.get(m)) for m in shown)] for r in rows]
    header = ["model", "dtype", "logits max error vs eager, calibration: none / stock / edgefuse",
              "held-out: none / stock / edgefuse",
              "recomposition (casts removed -> edgefuse): logits max error vs exact, held-out (inputs lower/higher)",
              "only norms quantized: the same", "own error of each rebuilt norm (lower/same/higher)",
              "worst own error"]
    errors_body = []
    for r in rows:
        def three(values):
            return " / ".join(_err(values, m) for m in shown)

        def worst(mode):
            values = [r.own[mode][k] for k in r.rebuilt if k in r.own.get(mode, {})]
            return f"{max(values):.3g}" if values else "-"

        errors_body.append([
            r.model, r.dtype, three(r.calibration), three(r.held_out), _change(r.held_out_exact, "casts"),
            _change(r.norms_only_exact, "casts"), str(own_error_changes(r)), f"{worst('casts')} -> {worst('edgefuse')}",
        ])
    return format_table(layout, body) + "\n\n" + format_table(header, errors_body)


def xnnpack_table(rows: Sequence[XnnpackRow]) -> str:
    """The XNNPACK table as text."""
    from edgefuse.console.tables import format_table

    header = ["model", "dtype", "scheme", "delegates stock -> edgefuse", "means outside stock -> edgefuse",
              "casts outside stock -> edgefuse", "max error vs eager stock/edgefuse",
              "vs exact model stock -> edgefuse (inputs lower/higher)",
              "vs quantized eager stock/edgefuse", "quantized eager vs eager"]
    body = []
    for r in rows:
        def pair(d):
            return f"{d.get('stock', '-')} -> {d.get('edgefuse', '-')}"
        body.append([
            r.model, r.dtype, r.scheme, pair(r.delegates), pair(r.means_outside), pair(r.casts_outside),
            f"{_err(r.error, 'stock')}/{_err(r.error, 'edgefuse')}",
            _change(r.error_exact, "stock"),
            f"{_err(r.error_quantized, 'stock')}/{_err(r.error_quantized, 'edgefuse')}",
            "-" if r.reference_error is None else f"{r.reference_error.max:.3g}",
        ])
    return format_table(header, body)
