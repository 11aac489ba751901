"""Measure the quantized flows on the tiny models and print the tables ``python -m edgefuse.quant`` shows.

QNN (capture, annotate, calibrate, convert; the converted program runs in eager, since lowering needs
the Qualcomm SDK): per model and dtype, the norms annotated as one op, the quantize/dequantize pairs
per norm and the error against eager, for the norms not rebuilt (``none``), rebuilt by the released
pass inside ``QnnQuantizer`` (``stock``) and rebuilt by edgefuse (``edgefuse``).

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
    """Largest and root-mean-square absolute error of a program's outputs against a reference."""

    max: float
    rms: float

    def __str__(self) -> str:
        return f"{self.max:.4g}"


def errors(run: Callable[..., Any], reference: Callable[..., Any], inputs: Sequence[Sequence[Any]]) -> Errors:
    """Errors of ``run`` against ``reference`` over every input tuple (first output of each)."""
    largest, squares, count = 0.0, 0.0, 0
    with torch.no_grad():
        for args in inputs:
            expected = _first(reference(*args)).double()
            actual = _first(run(*args)).double()
            diff = (actual - expected).abs()
            largest = max(largest, float(diff.max()))
            squares += float((diff**2).sum())
            count += diff.numel()
    return Errors(largest, math.sqrt(squares / max(count, 1)))


def _first(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        return _first(value[0])
    raise TypeError(f"expected a tensor output, got {type(value).__name__}")


@dataclass
class QnnRow:
    """One model and dtype through the three QNN flows."""

    model: str
    dtype: str
    norms: int = 0
    one_op: dict[str, int] = field(default_factory=dict)
    pairs: dict[str, list[int]] = field(default_factory=dict)
    calibration: dict[str, Errors] = field(default_factory=dict)
    held_out: dict[str, Errors] = field(default_factory=dict)
    own_exact: dict[str, float] = field(default_factory=dict)
    own_eager: dict[str, float] = field(default_factory=dict)
    own_by_norm: dict[str, dict[str, float]] = field(default_factory=dict)
    own_clipped: dict[str, dict[str, bool]] = field(default_factory=dict)
    norms_only_calibration: dict[str, Errors] = field(default_factory=dict)
    norms_only_held_out: dict[str, Errors] = field(default_factory=dict)
    left: list[tuple[str, str]] = field(default_factory=list)
    per_norm: dict[str, dict[str, str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def qnn_row(model_name: str, dtype: torch.dtype, held_out: int = 8, say=lambda _: None, norms_only: bool = True,
            **options: Any) -> QnnRow:
    """Quantize one tiny model for QNN three ways and measure each converted program against eager.

    Per flow: the logits' error over the calibration and the held-out inputs, the worst norm's own error
    (:mod:`edgefuse.quant.diagnose`) against the exact norm and against the eager one, and, with
    ``norms_only``, the logits' error when only the norms are quantized.
    """
    from edgefuse.models import build_model
    from edgefuse.quant.diagnose import norm_errors
    from edgefuse.quant.qnn import RECOMPOSE_MODES, quantize_for_qnn

    module, example = build_model(model_name, dtype, 0)
    calibration = calibration_inputs(example)
    others = held_out_inputs(example, held_out)
    row = QnnRow(model_name, str(dtype).removeprefix("torch."))
    for mode in RECOMPOSE_MODES[::-1]:  # none, stock, edgefuse
        say(f"QNN {model_name} {row.dtype} {mode}")
        try:
            result = quantize_for_qnn(module, example, calibration, recompose=mode, **options)
            row.norms = max(row.norms, len(result.norms))
            row.one_op[mode] = result.one_op
            row.pairs[mode] = [n.pairs for n in result.norms]
            for n in result.norms:
                row.per_norm.setdefault(n.key, {})[mode] = n.describe()
            if mode == "edgefuse":
                row.left = [(d.module_path or d.mean, d.reason) for d in result.decisions if not d.rebuilt]
            row.calibration[mode] = errors(result.converted, module, calibration)
            row.held_out[mode] = errors(result.converted, module, others)
            own = norm_errors(result.converted, module.get_submodule, calibration + others)
            row.own_exact[mode] = max((e.exact_error for e in own), default=0.0)
            row.own_eager[mode] = max((e.max_error for e in own), default=0.0)
            row.own_by_norm[mode] = {e.key: e.exact_error for e in own}
            row.own_clipped[mode] = {e.key: e.clipped for e in own}
            if norms_only:
                say(f"QNN {model_name} {row.dtype} {mode}, only the norms quantized")
                alone = quantize_for_qnn(module, example, calibration, recompose=mode, only_norms=True, **options)
                row.norms_only_calibration[mode] = errors(alone.converted, module, calibration)
                row.norms_only_held_out[mode] = errors(alone.converted, module, others)
        except Exception as error:  # one failing flow must not hide the others
            row.failed[mode] = f"{type(error).__name__}: {error}"
    return row


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
    error_quantized: dict[str, Errors] = field(default_factory=dict)
    reference_error: Errors | None = None
    norms: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def xnnpack_row(model_name: str, dtype: torch.dtype, scheme: str, held_out: int = 3, say=lambda _: None) -> XnnpackRow:
    """Quantize one tiny model with ``scheme``, lower it both ways, run both ``.pte`` against eager."""
    from edgefuse.lowering import summarize
    from edgefuse.models import build_model
    from edgefuse.ops import EDGE, Role
    from edgefuse.quant import xnnpack
    from edgefuse.runtime import LoadedProgram

    module, example = build_model(model_name, dtype, 0)
    row = XnnpackRow(model_name, str(dtype).removeprefix("torch."), scheme)
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
            top = lowered.exported_program().graph_module.graph
            row.casts_outside[how] = sum(1 for n in top.nodes if EDGE.is_a(n, Role.CAST))
            loaded = LoadedProgram(lowered.to_executorch().buffer)
            run = lambda *args: loaded.run(args)[0]  # noqa: E731
            row.error[how] = errors(run, module, inputs)
            row.error_quantized[how] = errors(run, quantized.module, inputs)
        except Exception as error:
            row.failed[how] = f"{type(error).__name__}: {error}"
    return row


def _pairs(values: list[int] | None) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def _err(errors: dict[str, "Errors"], mode: str) -> str:
    e = errors.get(mode)
    return "-" if e is None else f"{e.max:.3g}"


def _compare(ours: dict[str, float] | None, theirs: dict[str, float] | None, clipped: dict[str, bool] | None = None,
             margin: float = 0.01) -> str:
    """How many norms have a lower, the same (within ``margin``, relative) or a higher own error; of the
    higher ones, how many have their worst element clipped by the output quantization."""
    if not ours or not theirs:
        return "-"
    lower = same = higher = at_clip = 0
    for key, value in ours.items():
        other = theirs.get(key)
        if other is None:
            continue
        if abs(value - other) <= margin * max(value, other):
            same += 1
        elif value < other:
            lower += 1
        else:
            higher += 1
            at_clip += bool(clipped and clipped.get(key))
    return f"{lower}/{same}/{higher}" + (f" ({at_clip} clipped)" if higher else "")


def qnn_table(rows: Sequence[QnnRow]) -> str:
    """The QNN table as text; each cell with three values reads none / stock / edgefuse."""
    from edgefuse.table import format_table

    modes = ("none", "stock", "edgefuse")
    header = ["model", "dtype", "norms", "one op (stock, edgefuse)", "q/dq pairs per norm",
              "logits max error, calibration", "logits max error, held-out", "logits rms error, held-out",
              "worst norm's own error vs exact norm", "own error, edgefuse vs none (lower/same/higher)",
              "logits max error, only norms quantized (calibration; held-out)"]
    body = []
    for r in rows:
        def three(values, fmt=lambda v: f"{v.max:.3g}"):
            return " / ".join("-" if values.get(m) is None else fmt(values[m]) for m in modes)
        body.append([
            r.model, r.dtype, str(r.norms),
            f"{r.one_op.get('stock', '-')}, {r.one_op.get('edgefuse', '-')}",
            " / ".join(_pairs(r.pairs.get(m)) for m in modes),
            three(r.calibration), three(r.held_out), three(r.held_out, lambda v: f"{v.rms:.3g}"),
            three(r.own_exact, lambda v: f"{v:.3g}"),
            _compare(r.own_by_norm.get("edgefuse"), r.own_by_norm.get("none"), r.own_clipped.get("edgefuse")),
            f"{three(r.norms_only_calibration)}; {three(r.norms_only_held_out)}",
        ])
    return format_table(header, body)


def xnnpack_table(rows: Sequence[XnnpackRow]) -> str:
    """The XNNPACK table as text."""
    from edgefuse.table import format_table

    header = ["model", "dtype", "scheme", "delegates stock -> edgefuse", "means outside stock -> edgefuse",
              "casts outside stock -> edgefuse", "max error vs eager stock/edgefuse",
              "vs quantized eager stock/edgefuse", "quantized eager vs eager"]
    body = []
    for r in rows:
        def pair(d):
            return f"{d.get('stock', '-')} -> {d.get('edgefuse', '-')}"
        body.append([
            r.model, r.dtype, r.scheme, pair(r.delegates), pair(r.means_outside), pair(r.casts_outside),
            f"{_err(r.error, 'stock')}/{_err(r.error, 'edgefuse')}",
            f"{_err(r.error_quantized, 'stock')}/{_err(r.error_quantized, 'edgefuse')}",
            "-" if r.reference_error is None else f"{r.reference_error.max:.3g}",
        ])
    return format_table(header, body)
