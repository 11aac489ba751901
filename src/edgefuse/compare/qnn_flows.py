"""The QNN comparison that ``lower --backend qnn``, ``report --compile`` and the QNN model table share.

One model is lowered through ExecuTorch's own QNN flow twice, with edgefuse's recomposition and with the
stock one (:func:`edgefuse.qnn.lower`); each lowered program is serialized, run on the x86 HTP emulator
(:func:`edgefuse.qnn.run_on_emulator`) and compared with its reference:

- **fp16**: with the eager module (float32), at :data:`FP16_ULPS` units in the last place of float16 at
  the output's largest magnitude. The HTP rounds each op's result to float16 (half a unit of it at
  most), and an output carries the roundings of the ops on its path, each scaled by the gains after
  it: the tiny models' outputs pass through about 16 roundings that reach them undamped (the residual
  stream of a layer or two: norm, projections, attention, MLP), so 16 × 1/2 = 8 units. Measured on
  programs QNN computes right: 0.5 to 2.2 units; a norm QNN computes wrong moves outputs by tens to
  thousands.
- **quantized** (16a8w, ...): with the fake-quantized module (the converted PT2E program run in eager:
  the same quantization steps, simulated in float), at as many steps of the output's quantization scale
  as there are roundings on the output's longest path (:func:`edgefuse.qnn.emulator.roundings`, read
  from the converted program on the inputs: a quantize that gets values already on its grid, after a
  reshape or a transpose, rounds nothing). The HTP computes each quantized op from the same integer
  inputs as the simulation and may land on the neighbouring level: one step of that op's output, which
  the ops after it carry to the output, as float16's roundings are counted above. Where the ops after
  a rounding carry its level at more than one output step (a norm divides by its row's rms: Gemma 3's
  layer carries its roundings to 34 output steps where its longest path counts 23), the module itself
  says how far: run again with every rounding one level off, it moves the output by ``carried`` steps,
  and the larger of the two is allowed (:attr:`edgefuse.qnn.emulator.Roundings.steps`). The coarsest
  step the output depends on is reported beside it. A tolerance looser than float16's on the same
  output (:func:`told_apart`: an additive attention mask of -inf or -1e4 quantized at 16 bits puts the
  scores' step at 1.0 or 0.15, and a level there moves the output by hundreds to thousands of its
  steps) cannot tell such a program apart from a wrong one, and the table says so: it does not pass.
  Against float eager the error is shown as information: it is the quantization's.

What QNN built is read from the graphs QNN compiled (:attr:`edgefuse.qnn.QnnLowered.graphs`): the QNN
ops of each delegate by type, and for each norm edgefuse rebuilt the QNN op its ``rms_norm`` became.
For the report, each norm's module is followed into the delegates (:func:`norm_ops`): the QNN op
each of its nodes became, or the op left outside.

Everything here returns data; the commands print.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.fx import GraphModule, Node

from edgefuse.core._fx import module_path
from edgefuse.inputs.errors import Unavailable, qnn_sdk_error
from edgefuse.inputs.modelspec import error_summary
from edgefuse.compare.pte_checks import flat_tensors
from edgefuse.compare.stock_and_edgefuse import DelegateSummary, op_name, summarize
from edgefuse.core.fresh import fresh, kept_state
from edgefuse.runtime.log import native_output_held
from edgefuse.quant.facts import is_dequantize, is_quantize
from edgefuse.core.verify import TOLERANCES, Comparison, compare, mean_error

EDGEFUSE = "edgefuse"
STOCK = "stock"
FP16 = "fp16"
#: Units in the last place of float16 at the output's largest magnitude (see the module doc): counted
#: for the roundings of a layer or two, the depth of the models the table and the tests lower; a deeper
#: model's output carries more, and may exceed it while QNN computes it right.
FP16_ULPS = TOLERANCES["qnn float16"].ulps
QNN_BACKEND = "QnnBackend"
#: The QNN op type of a rebuilt norm (``qti.aisw::RmsNorm``, built from ``aten.rms_norm``).
RMS_NORM = "RmsNorm"
OUTSIDE = "outside"
VARIES = "its outputs change with what ran before it on the emulator (QNN reads memory it did not write)"

Say = Callable[[str], None]


@dataclass
class QnnProgram:
    """One model lowered through QNN's flow one way: what QNN built, and how its ``.pte`` ran."""

    how: str  # "edgefuse" or "stock"
    precision: str
    soc: str
    lowered: Any = None  # the library's QnnLowered; None when QNN could not lower the model
    failure: str | None = None  # QNN's reason it could not lower the model, or why its .pte did not run
    summary: DelegateSummary | None = None
    pte: bytes = b""
    reference: str = "eager"  # what ``error`` is measured against
    error: float | None = None
    allowed: float | None = None
    float_error: float | None = None  # quantized programs: against float eager, for information
    module_float_error: float | None = None  # quantized programs: the fake-quantized module against float eager
    rounding_down_error: float | None = None  # against the module whose rms_norm outputs round down as ExecuTorch's QNN RmsNorm does
    mean_error: float | None = None  # quantized programs: the worst output's mean |error| against its module
    mean_float_error: float | None = None  # quantized programs: the same output's mean |error| against float eager
    rounding_down_mean_error: float | None = None  # quantized programs: that output's mean |error| against the
    # module whose rms_norm outputs round down
    roundings: Any = None  # quantized programs: the Roundings of the worst output (edgefuse.qnn.emulator)
    step: float | None = None  # quantized programs: that output's quantization step
    within: bool = False  # every output within its tolerance
    outputs: list = None  # what the emulator returned on the inputs
    repeatable: bool | None = None  # the same outputs again after the other programs ran (check_repeatable)
    told_apart: bool = True  # quantized programs: every tolerance no looser than float16's (told_apart)

    @property
    def lowered_ok(self) -> bool:
        return self.lowered is not None

    @property
    def ran(self) -> bool:
        return self.error is not None


    @property
    def ok(self) -> bool:
        """Lowered, ran, every output within its tolerance against the reference, and that tolerance able
        to tell a wrong program apart."""
        return self.ran and self.within and self.told_apart

    def coarsest(self) -> str:
        """The coarsest quantization step the worst output depends on, and how many output steps it is."""
        r = self.roundings
        return (f"coarsest step {r.coarsest:.3g} after {r.coarsest_op} = {r.coarsest_steps:.0f} output steps, "
                f"one level of it alone moves the output {r.coarsest_carried:.1f}")

    @property
    def rms_norms(self) -> int:
        """QNN ``RmsNorm`` ops in the compiled graphs."""
        return self.lowered.graphs.rms_norms if self.lowered_ok else 0

    @property
    def viewed(self) -> int:
        """Norms edgefuse normalized on a ``[1, rows, D]`` view for a limit, rebuilt or whole, over every pipeline."""
        return sum(n.action == "viewed" for n in getattr(self.lowered, "legalized", ()))

    @property
    def found(self) -> int:
        """Candidate norms edgefuse found: those of its first recomposition run (a later run in another
        pipeline sees again only the norms the first left)."""
        runs = [run for run in getattr(self.lowered, "runs", ()) if run.name == "RecomposeRmsNorm"]
        return len(runs[0].decisions) if runs else 0

    @property
    def rebuilt(self) -> int:
        """Norms edgefuse rebuilt, over all its runs."""
        return sum(1 for d in getattr(self.lowered, "decisions", ()) if d.rebuilt)

    def line(self) -> str:
        """``edgefuse: 4 of 4 norms rebuilt, 4 RmsNorm in QNN; 1 delegate, 0 ops outside; max error ...``."""
        if not self.lowered_ok:
            return f"{self.how}: {self.failure}"
        parts = [f"{self.rebuilt} of {self.found} norms rebuilt"] if self.how == EDGEFUSE else []
        parts.append(f"{self.rms_norms} RmsNorm in QNN")
        text = f"{self.how}: {', '.join(parts)}; {_delegates(self.summary)}"
        if not self.ran:
            return text + f"; did not run on the emulator: {self.failure}"
        verdict = ("within" if self.told_apart else "within but NOT TOLD APART,") if self.within else "OUTSIDE"
        text += f"; max error against {self.reference} {self.error:.2e} ({verdict} {self.allowed:.2e})"
        if self.roundings is not None:
            text += f" = {_steps(self.roundings)}; {self.coarsest()}"
        if self.float_error is not None:
            text += f", against float eager {self.float_error:.2e} (information)"
        if self.repeatable is False:
            text += f"; {VARIES}"
        return text


def _steps(counted) -> str:
    """``28 steps: 28 roundings on the longest path, 23.0 carried``: the allowed steps and their two sources."""
    return (f"{counted.steps:.0f} steps: {counted.count} roundings on the longest path, "
            f"{counted.carried:.1f} carried when each lands one level off")


def failures(program: QnnProgram) -> list[str]:
    """What fails edgefuse's QNN program: not lowered, not run, outside its tolerance, or a norm it rebuilt
    that QNN did not compile as one RmsNorm."""
    if not program.lowered_ok:
        return [f"the {program.how} lowering failed: {program.failure}"]
    found = []
    if not program.ran:
        found.append(f"the {program.how} program did not run on the emulator: {program.failure}")
    elif program.within and not program.told_apart:
        found.append(
            f"the {program.how} program cannot be told apart from a wrong one: its tolerance "
            f"{program.allowed:.2e} is looser than float16's on the same output"
            + (f" ({program.coarsest()})" if program.roundings is not None else "")
        )
    elif not program.ok:
        found.append(
            f"the {program.how} program differs from {program.reference} by {program.error:.2e}, more than the "
            f"allowed {program.allowed:.2e}" + (f" ({program.coarsest()})" if program.roundings is not None else "")
        )
    if program.repeatable is False:
        found.append(f"the {program.how} program's {VARIES}")
    missing = not_one_rms_norm(program)
    if missing:
        found.append(f"rebuilt but not one QNN RmsNorm: {', '.join(missing)}")
    return found


#: The key of the model's own ``forward`` (a node no submodule produced) in :func:`norm_ops`.
ROOT = ""


def not_one_rms_norm(program: QnnProgram) -> list[str]:
    """The modules (:data:`ROOT` for the model's own ``forward``) of norms edgefuse rebuilt that QNN did
    not compile each as one ``RmsNorm``, with what they became.

    A norm is followed by its module (``nn_module_stack`` survives quantization and re-export, node names
    do not): a module whose code holds ``n`` rebuilt norms must hold ``n`` ``RmsNorm`` ops in QNN.
    """
    if not program.lowered_ok:
        return []
    rebuilt = Counter(d.module_path or ROOT for d in program.lowered.decisions if d.rebuilt)
    ops = norm_ops(program.lowered)
    missing = []
    for path, count in rebuilt.items():
        in_qnn = [op for where, op in ops.get(path, []) if where == QNN_BACKEND]
        if in_qnn.count(RMS_NORM) < count:
            where = path if path != ROOT else "the model's own forward"
            missing.append(f"{where} ({describe_norm(ops.get(path, []))})")
    return missing


def _delegates(summary: DelegateSummary | None) -> str:
    if summary is None:
        return "-"
    counts = ", ".join(f"{n} {op}" for op, n in Counter(summary.outside).most_common())
    return (
        f"{summary.delegates} delegate{'s' if summary.delegates != 1 else ''}, {len(summary.outside)} "
        f"op{'s' if len(summary.outside) != 1 else ''} outside" + (f" ({counts})" if counts else "")
    )


# --- lowering -------------------------------------------------------------------------------------------

def lower_qnn(
    module: torch.nn.Module, inputs: tuple, how: str, *, soc: str, precision: str, say: Say = lambda _: None,
) -> QnnProgram:
    """Lower ``module`` through QNN's flow with ``how``'s recomposition (calibrated on ``inputs`` when
    quantized) and serialize it.

    QNN refusing the model is recorded on the result (``failure``: QNN's reason), not raised; missing
    QNN libraries raise :class:`~edgefuse.inputs.errors.Unavailable` (exit 3) with the library's message,
    which names ``edgefuse qnn setup``.
    """
    qnn = qnn_library()
    program = QnnProgram(how, precision, soc)
    say(f"lowering for QNN ({how}, {soc}, {precision})")
    try:
        with native_output_held() as log:
            lowered = qnn.lower(module, tuple(inputs), soc=soc, precision=precision, recompose=how)
    except qnn.QnnLoweringFailed as error:
        program.failure = with_qnn_log(str(error), log)
        return program
    except qnn.QnnLibrariesMissing as error:
        raise qnn_sdk_error(error) from error
    program.lowered = lowered
    program.summary = qnn_summary(lowered, how)
    say(f"serializing the {how} QNN program to .pte")
    with native_output_held():
        program.pte = lowered.to_pte()
    return program


def qnn_summary(lowered, label: str) -> DelegateSummary:
    """The delegates and the ops outside them, each QNN delegate with the QNN ops it compiled (by type)."""
    graphs = {graph.delegate: graph for graph in lowered.graphs.delegates}

    def qnn_ops(name: str, _) -> list[str] | None:
        graph = graphs.get(name)
        return [op.type for op in graph.ops] if graph is not None and graph.ops else None

    return summarize(lowered.edge, label, qnn_ops)


def with_qnn_log(message: str, log: list[str]) -> str:
    """``message`` and what QNN logged about the failure (its error lines), which says why where
    ExecuTorch's exception often does not ("Failed to generate Qnn context binary")."""
    from edgefuse.qnn.sdk import qnn_log_lines

    lines = qnn_log_lines("".join(log))
    return f"{message.rstrip('.')}; QNN logged: {lines}" if lines else message


def require_libraries() -> None:
    """Load QNN's libraries into this process, or raise :class:`~edgefuse.inputs.errors.Unavailable` (exit 3)
    with the library's reason, which names ``edgefuse qnn setup``: before any slow work."""
    try:
        from edgefuse.qnn.sdk import QnnSdkUnavailable, ensure_in_process
    except Exception as error:  # noqa: BLE001  (an installation without edgefuse's QNN package)
        raise Unavailable(f"edgefuse's QNN support is unavailable: {type(error).__name__}: {error}") from error
    try:
        ensure_in_process()
    except QnnSdkUnavailable as error:
        raise qnn_sdk_error(error) from error


def qnn_library():
    """:mod:`edgefuse.qnn`, or :class:`~edgefuse.inputs.errors.Unavailable` when it does not import."""
    try:
        import edgefuse.qnn as qnn

        qnn.lower, qnn.run_on_emulator  # noqa: B018  (both halves: the pipeline and the emulator)
        qnn.QnnLoweringFailed, qnn.QnnLibrariesMissing, qnn.QnnSdkUnavailable  # noqa: B018
    except Exception as error:  # missing or half-built: the command says so instead of crashing
        raise Unavailable(
            f"edgefuse's QNN flow is unavailable: importing edgefuse.qnn failed ({type(error).__name__}: {error})"
        ) from error
    return qnn


# --- running on the emulator ------------------------------------------------------------------------------

def run_and_check(
    program: QnnProgram, module: torch.nn.Module, inputs: tuple, say: Say = lambda _: None, reference: str = "eager",
) -> QnnProgram:
    """Run ``program``'s ``.pte`` on the x86 HTP emulator and measure its error against its reference:
    ``module`` (named ``reference``: ``eager``, or ``program`` for a saved one) for fp16, the
    fake-quantized module for a quantized program (and ``module`` as information).

    A quantized program's worst output also gets its mean distance from each: its largest is one value
    of thousands, which one level more or less at one element moves."""
    if not program.lowered_ok:
        return program
    qnn = qnn_library()
    say(f"running the {program.how} program on the x86 HTP emulator")
    try:
        with native_output_held():
            actual = qnn.run_on_emulator(program.pte, list(inputs))
    except qnn.QnnSdkUnavailable as error:
        raise qnn_sdk_error(error) from error
    except Exception as error:  # noqa: BLE001  (the runtime's reason, with its log, is the result)
        program.failure = error_summary(error)
        return program
    program.outputs = actual
    expected = flat_tensors(_eager(module, inputs))
    down: list[torch.Tensor] = []  # the outputs of the module whose norms round down
    down_errors: list[float] = []  # each output's error against them
    if program.precision == FP16:
        program.reference = reference
        comparisons = _compared(expected, actual, lambda e, a, _: compare(e, a, ulps=FP16_ULPS, dtype=torch.float16))
    else:
        from edgefuse.qnn.emulator import compare_at_steps, output_tolerances, rms_norm_roundings, rounding_down

        program.reference = "the fake-quantized module"
        fake = program.lowered.reference
        tolerances = output_tolerances(fake, inputs)

        def at_steps(e: torch.Tensor, a: torch.Tensor, i: int):
            if i >= len(tolerances) or tolerances[i] is None:  # left in float by the quantizer: float16's
                return compare(e, a, ulps=FP16_ULPS, dtype=torch.float16)
            step, counted = tolerances[i]
            return compare_at_steps(e, a, step, counted.steps)

        simulated = flat_tensors(_eager(fake, inputs))
        comparisons = _compared(simulated, actual, at_steps)
        program.told_apart = len(simulated) == len(comparisons) and all(
            told_apart(e, c.allowed) for e, c in zip(simulated, comparisons)
        )
        program.float_error = max((c.max_error for c in _compared(expected, actual, _plain)), default=0.0)
        program.module_float_error = max((c.max_error for c in _compared(expected, simulated, _plain)), default=0.0)
        norms = rms_norm_roundings(fake)
        if norms:
            with kept_state(fake):
                down = flat_tensors(rounding_down(fake, norms)(*fresh(tuple(inputs))))
            down_errors = [c.max_error for c in _compared(down, actual, _plain)]
    worst = max(comparisons, key=lambda c: (not c.ok, _ratio(c.max_error, c.allowed)), default=None)
    if program.precision != FP16 and worst is not None:
        i = comparisons.index(worst)
        if down_errors:  # the worst output's, in the steps of that output
            program.rounding_down_error = down_errors[i]
        if worst.shape_ok and len(simulated) == len(actual) == len(expected):
            program.mean_error = mean_error(simulated[i], actual[i])
            program.mean_float_error = mean_error(expected[i], actual[i])
            if len(down) == len(actual):
                program.rounding_down_mean_error = mean_error(down[i], actual[i])
        if i < len(tolerances) and tolerances[i] is not None:
            program.step, program.roundings = tolerances[i]
    # the error and the bound of one output, the worst against its own bound
    program.error = worst.max_error if worst is not None else 0.0
    program.allowed = worst.allowed if worst is not None else 0.0
    program.within = all(c.ok for c in comparisons)
    return program


def told_apart(expected: torch.Tensor, allowed: float) -> bool:
    """Whether a quantized program's tolerance ``allowed`` on the output ``expected`` is no looser than a
    float16 program's on it (:data:`FP16_ULPS` units of float16 at its largest magnitude).

    A looser one is set by one coarse op's resolution, not by the program's arithmetic: with a -inf
    attention mask, quantized at 16 bits, the scores' step is 1.0, and ExecuTorch's Llama's logits were
    allowed 0.68 to 2.26 (measured on QNN 2.51's emulator, 16a4w) where float16 allows 0.018. A program
    inside such a tolerance cannot be told apart from one wrong by as much, and does not pass on it."""
    if not expected.is_floating_point():
        return True
    return allowed <= compare(expected, expected, ulps=FP16_ULPS, dtype=torch.float16).allowed


def check_repeatable(programs: list[QnnProgram], inputs: tuple) -> None:
    """Run each program that ran once more on ``inputs`` after the others ran on other values (after
    itself, when no other program ran: stock could not lower the model), and record on it whether its
    outputs are the same, bit for bit.

    A program whose outputs change so reads memory it did not write: measured on QNN 2.51's emulator, the
    stock fp16 program of ExecuTorch's Llama with QK norms (head dim 32), whose norms QNN computes wrong,
    gave 0.267 off eager in a fresh process and 0.265 to 0.294 after the edgefuse program of the same
    model ran on one input or another, while a program QNN computes right gave the same bits whatever
    ran before. Its error then says nothing on its own, and the table marks it.
    """
    qnn = qnn_library()
    ran = [program for program in programs if program.ran and program.outputs is not None]
    other = _other_values(inputs)
    for program in ran:
        try:
            with native_output_held():
                for before in [p for p in ran if p is not program] or [program]:  # itself when alone
                    qnn.run_on_emulator(before.pte, list(other))
                again = qnn.run_on_emulator(program.pte, list(inputs))
        except Exception as error:  # noqa: BLE001  (it ran once: a second failure is the result)
            program.repeatable, program.failure = False, error_summary(error)
            continue
        program.repeatable = len(again) == len(program.outputs) and all(
            torch.equal(a, b) for a, b in zip(program.outputs, again)
        )


def _other_values(inputs: tuple) -> tuple:
    """``inputs`` with each tensor's elements moved one place along its flattened order: the same dtypes,
    shapes and values (tokens stay in the vocabulary), held at other places."""
    return tuple(
        torch.roll(t.contiguous().view(-1), 1).view(t.shape) if isinstance(t, torch.Tensor) and t.numel() > 1 else t
        for t in inputs
    )


def _compared(expected: list[torch.Tensor], actual: list[torch.Tensor], how) -> list[Comparison]:
    """``how(expected, actual, index)`` per output; a different number of outputs is one failed comparison."""
    if len(expected) != len(actual):
        return [Comparison(False, False, math.inf, 0.0)]
    return [how(e, a.to(e.dtype) if a.is_floating_point() else a, i) for i, (e, a) in enumerate(zip(expected, actual))]


def _plain(e: torch.Tensor, a: torch.Tensor, _: int) -> Comparison:
    return compare(e, a)


def _ratio(error: float, allowed: float) -> float:
    return error / allowed if allowed > 0 else (0.0 if error == 0 else math.inf)


def _eager(module, inputs: tuple):
    with torch.no_grad(), kept_state(module):
        return fresh(module(*fresh(tuple(inputs))))


# --- what QNN built, per norm -----------------------------------------------------------------------------

def _placed_nodes(lowered) -> Iterator[tuple[str, str, str, Any]]:
    """``(module path, where, op, QNN op or None)`` of each node of the lowered program, as :func:`norm_ops`
    counts them: the QNN op is the one QNN compiled the node as, when its graph names one after it."""
    graphs = lowered.graphs

    def visit(graph_module: GraphModule, where: str) -> Iterator[tuple[str, str, str, Any]]:
        for node in graph_module.graph.nodes:
            if node.op != "call_function" or node.target is operator.getitem or is_quantize(node) or is_dequantize(node):
                continue
            if "executorch_call_delegate" in str(node.target):
                delegate = getattr(graph_module, node.args[0].target)
                inner = getattr(getattr(delegate, "original_module", None), "graph_module", None)
                if inner is not None:
                    yield from visit(inner, getattr(delegate, "backend_id", None) or "delegate")
                continue
            compiled = graphs.find(node.name) if where == QNN_BACKEND else None
            qnn_op = compiled[1] if compiled is not None else None
            yield module_path(node) or ROOT, where, qnn_op.type if qnn_op is not None else op_name(node), qnn_op

    yield from visit(lowered.edge.exported_program().graph_module, OUTSIDE)


def norm_ops(lowered) -> dict[str, list[tuple[str, str]]]:
    """For each module path (:data:`ROOT` for the model's own ``forward``), what its code became in the
    lowered program: ``(where, op)`` pairs, ``where``
    the delegate's backend (``QnnBackend``) with ``op`` the QNN op type QNN compiled the node as (the
    edge op's name when QNN's graph names no op after it), or ``"outside"`` with the edge op. Quantize
    and dequantize ops (QNN folds them into its tensors' encodings) and tuple access are left out."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path, where, op, _ in _placed_nodes(lowered):
        found.setdefault(path, []).append((where, op))
    return found


def norm_roundings(lowered) -> dict[str, set[str]]:
    """For each module path, how the quantized QNN ``RmsNorm`` ops its code became round their output
    (:data:`edgefuse.qnn.graphs.NEAREST`, :data:`~edgefuse.qnn.graphs.DOWN`): a norm the flow kept whole
    has no decision, so its rounding is read here, from the op."""
    found: dict[str, set[str]] = {}
    for path, _, _, qnn_op in _placed_nodes(lowered):
        if qnn_op is not None and qnn_op.rounding:
            found.setdefault(path, set()).add(qnn_op.rounding)
    return found


def describe_norm(ops: list[tuple[str, str]]) -> str:
    """The QNN op a norm became: ``RmsNorm``, or the ops it stayed as, in QNN and outside it."""
    if not ops:
        return "not found in the lowered program"
    in_qnn = [op for where, op in ops if where == QNN_BACKEND]
    outside = [op for where, op in ops if where != QNN_BACKEND]
    if in_qnn.count(RMS_NORM) == 1:
        rest = [op for op in in_qnn if op != RMS_NORM]
        text = RMS_NORM + (f" (and {_counts(rest)})" if rest else "")
    elif in_qnn:
        text = f"{len(in_qnn)} QNN ops: {_counts(in_qnn)}"
    else:
        text = ""
    if outside:
        text += ("; " if text else "") + f"{len(outside)} op{'s' if len(outside) != 1 else ''} outside QNN: {_counts(outside)}"
    return text


def describe_rounding(lowered, module_path: str | None, described: str,
                      roundings: dict[str, set[str]] | None = None) -> str:
    """``described`` (:func:`describe_norm`, of the norm of ``module_path``) with how its quantized
    ``RmsNorm`` rounds its output: ``RmsNorm, output rounds to nearest`` (edgefuse's builder,
    :mod:`edgefuse.qnn.visitors`) or ``... rounds down`` (ExecuTorch's); unchanged for a float norm, a norm
    not one ``RmsNorm``, or a module path whose norms QNN's graphs place with no one rounding. A norm
    rebuilt has its decision's place; one the flow kept whole (``nn.RMSNorm``, ``F.rms_norm``) only its op,
    found by module path (:func:`norm_roundings`)."""
    from edgefuse.qnn.graphs import DOWN

    found = {p.rounding for p in lowered.graphs.norms if p.module_path == module_path and p.rounding}
    roundings = norm_roundings(lowered) if roundings is None else roundings
    found |= roundings.get(module_path or ROOT, set())
    rounding = found.pop() if len(found) == 1 else None
    if rounding is None or not described.startswith(RMS_NORM):
        return described
    return described.replace(RMS_NORM, f"{RMS_NORM}, output rounds {'down' if rounding == DOWN else 'to ' + rounding}", 1)


def _counts(ops: list[str]) -> str:
    return ", ".join(f"{n}× {op}" if n > 1 else op for op, n in Counter(ops).most_common())

