"""The QNN comparison that ``lower --backend qnn``, ``report --compile`` and the QNN model table share.

One model is lowered through ExecuTorch's own QNN flow twice, with edgefuse's recomposition and with the
stock one (:func:`edgefuse.qnn.lower`); each lowered program is serialized, run on the x86 HTP emulator
(:func:`edgefuse.qnn.run_on_emulator`) and compared with its reference:

- **fp16**: with the eager module (float32), at :data:`FP16_ULPS` units in the last place of float16 at
  the output's largest magnitude. The HTP computes every op in float16 and rounds each result once, so
  a chain of a few dozen ops moves its outputs by a few units of float16 against float32 eager (tiny
  Qwen3's decoder layer: 6 units; ExecuTorch's own Llama, norms left decomposed: about 5). 32 units
  leave room for deeper models and still catch a norm QNN computes wrong (hundreds of units).
- **quantized** (16a8w, ...): with the fake-quantized module (the converted PT2E program run in eager:
  the same quantization steps, simulated in float), at :data:`QUANT_STEPS` steps of the output's
  quantization scale: each quantized op on the HTP may round its output to the neighbouring step where
  the simulation rounds the other way, and a step moved early moves later outputs by its size times
  the gains between. Against float eager the error is shown as information: it is the quantization's.

What QNN built is read from the graphs QNN compiled (:attr:`edgefuse.qnn.QnnLowered.graphs`): the QNN
ops of each delegate by type, and for each norm edgefuse rebuilt the QNN op its ``rms_norm`` became.
For the report, each norm's module is followed into the delegates (:func:`norm_ops`): the QNN op
each of its nodes became, or the op left outside.

Everything here returns data; the commands print.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.fx import GraphModule, Node
from torch.utils import _pytree as pytree

from edgefuse.flows import flat_tensors
from edgefuse.fresh import fresh, kept_state
from edgefuse.lowering import DelegateSummary, op_name, summarize
from edgefuse.modelspec import error_summary
from edgefuse.quant.facts import is_dequantize, is_quantize
from edgefuse.verify import finite_tolerance, max_error

EDGEFUSE = "edgefuse"
STOCK = "stock"
FP16 = "fp16"
#: Units in the last place of float16 at the output's largest magnitude (see the module doc).
FP16_ULPS = 32
#: Quantization steps of the output allowed between the HTP and the fake-quantized module.
QUANT_STEPS = 64
QNN_BACKEND = "QnnBackend"
#: The QNN op type of a rebuilt norm (``qti.aisw::RmsNorm``, built from ``aten.rms_norm``).
RMS_NORM = "RmsNorm"
OUTSIDE = "outside"

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

    @property
    def lowered_ok(self) -> bool:
        return self.lowered is not None

    @property
    def ran(self) -> bool:
        return self.error is not None

    @property
    def ok(self) -> bool:
        """Lowered, ran, and within the tolerance of its reference."""
        return self.ran and self.error <= self.allowed

    @property
    def rms_norms(self) -> int:
        """QNN ``RmsNorm`` ops in the compiled graphs."""
        return self.lowered.graphs.rms_norms if self.lowered_ok else 0

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
        verdict = "within" if self.ok else "OUTSIDE"
        text += f"; max error against {self.reference} {self.error:.2e} ({verdict} {self.allowed:.2e})"
        if self.float_error is not None:
            text += f", against float eager {self.float_error:.2e} (information)"
        return text


def failures(program: QnnProgram) -> list[str]:
    """What fails edgefuse's QNN program: not lowered, not run, outside its tolerance, or a norm it rebuilt
    that QNN did not compile as one RmsNorm."""
    if not program.lowered_ok:
        return [f"the {program.how} lowering failed: {program.failure}"]
    found = []
    if not program.ran:
        found.append(f"the {program.how} program did not run on the emulator: {program.failure}")
    elif not program.ok:
        found.append(
            f"the {program.how} program differs from {program.reference} by {program.error:.2e}, more than the "
            f"allowed {program.allowed:.2e}"
        )
    missing = not_one_rms_norm(program)
    if missing:
        found.append(f"rebuilt but not one QNN RmsNorm: {', '.join(missing)}")
    return found


def not_one_rms_norm(program: QnnProgram) -> list[str]:
    """The modules (or means, where the graph names no module) of norms edgefuse rebuilt that QNN did not
    compile each as one ``RmsNorm``, with what they became.

    A norm is followed by its module (``nn_module_stack`` survives quantization and re-export, node names
    do not): a module whose code holds ``n`` rebuilt norms must hold ``n`` ``RmsNorm`` ops in QNN.
    """
    if not program.lowered_ok:
        return []
    rebuilt = Counter(d.module_path or d.mean for d in program.lowered.decisions if d.rebuilt)
    ops = norm_ops(program.lowered)
    missing = []
    for path, count in rebuilt.items():
        in_qnn = [op for where, op in ops.get(path, []) if where == QNN_BACKEND]
        if in_qnn.count(RMS_NORM) < count:
            missing.append(f"{path} ({describe_norm(ops.get(path, []))})")
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

@contextlib.contextmanager
def native_output_held() -> Iterator[list[str]]:
    """File descriptors 1 and 2 sent to a temporary file while the block runs, and log records below
    ERROR dropped: QNN's libraries print op tables and set-up notes from native code, which Python's own
    redirection does not catch, and they would land among the results on stdout. The list yielded holds
    what was printed once the block ends."""
    from edgefuse.progress import quiet_root_logger

    held: list[str] = []
    sys.stdout.flush(), sys.stderr.flush()
    with tempfile.TemporaryFile("w+b") as sink:
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        try:
            for fd in saved:
                os.dup2(sink.fileno(), fd)
            with quiet_root_logger():
                yield held
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            held.append(sink.read().decode("utf-8", "replace"))


def lower(
    module: torch.nn.Module, inputs: tuple, how: str, *, soc: str, precision: str, say: Say = lambda _: None,
) -> QnnProgram:
    """Lower ``module`` through QNN's flow with ``how``'s recomposition (calibrated on ``inputs`` when
    quantized) and serialize it.

    QNN refusing the model is recorded on the result (``failure``: QNN's reason), not raised; missing
    QNN libraries raise (an :class:`~edgefuse.errors.Unavailable` naming ``edgefuse qnn setup``).
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
    program.lowered = lowered
    program.summary = summarize(lowered.edge, how)
    say(f"serializing the {how} QNN program to .pte")
    with native_output_held():
        program.pte = lowered.to_pte()
    return program


def with_qnn_log(message: str, log: list[str]) -> str:
    """``message`` and what QNN logged about the failure (its error lines), which says why where
    ExecuTorch's exception often does not ("Failed to generate Qnn context binary")."""
    from edgefuse.qnn.sdk import qnn_log_lines

    lines = qnn_log_lines("".join(log))
    return f"{message.rstrip('.')}; QNN logged: {lines}" if lines else message


def qnn_library():
    """:mod:`edgefuse.qnn`, or :class:`~edgefuse.errors.Unavailable` when it does not import."""
    from edgefuse.errors import Unavailable

    try:
        import edgefuse.qnn as qnn

        qnn.lower, qnn.run_on_emulator  # noqa: B018  (both halves: the pipeline and the emulator)
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
    fake-quantized module for a quantized program (and ``module`` as information)."""
    if not program.lowered_ok:
        return program
    from edgefuse.errors import Unavailable

    qnn = qnn_library()
    say(f"running the {program.how} program on the x86 HTP emulator")
    try:
        with native_output_held():
            actual = qnn.run_on_emulator(program.pte, list(inputs))
    except Unavailable:
        raise
    except Exception as error:  # noqa: BLE001  (the runtime's reason, with its log, is the result)
        program.failure = error_summary(error)
        return program
    expected = flat_tensors(_eager(module, inputs))
    if program.precision == FP16:
        program.reference = reference
        wanted = expected
        allowed = [finite_tolerance(torch.float16, e, FP16_ULPS) for e in expected]
    else:
        program.reference = "the fake-quantized module"
        fake = program.lowered.reference
        wanted = flat_tensors(_eager(fake, inputs))
        scales = output_scales(fake) if isinstance(fake, GraphModule) else []
        scales += [None] * (len(wanted) - len(scales))
        allowed = [
            QUANT_STEPS * s if s is not None else finite_tolerance(torch.float16, w, FP16_ULPS)
            for s, w in zip(scales, wanted)
        ]
        program.float_error = _errors(expected, actual)[0]
    program.error, program.allowed = _errors(wanted, actual, allowed)
    return program


def _eager(module, inputs: tuple):
    with torch.no_grad(), kept_state(module):
        return fresh(module(*fresh(tuple(inputs))))


def _errors(expected: list[torch.Tensor], actual: list[torch.Tensor], allowed: list[float] | None = None):
    """``(max error, tolerance)`` over the outputs, the tolerance being that of the output that comes
    closest to (or goes furthest past) its own; ``(inf, 0)`` when their number or shapes differ."""
    if len(expected) != len(actual) or any(e.shape != a.shape for e, a in zip(expected, actual)):
        return math.inf, 0.0
    errors = [max_error(e, a.to(e.dtype)) for e, a in zip(expected, actual)]
    allowed = allowed or [0.0] * len(errors)
    if not errors:
        return 0.0, 0.0

    def ratio(i: int) -> float:
        return errors[i] / allowed[i] if allowed[i] > 0 else (0.0 if errors[i] == 0 else math.inf)

    worst = max(range(len(errors)), key=ratio)
    return max(errors), allowed[worst]


def output_scales(graph_module: GraphModule) -> list[float | None]:
    """For each output of a converted (fake-quantized) graph, the scale of the dequantize it is read from
    (past views and copies, which keep the values), or None when it is not read from a quantized tensor."""
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    scales = []
    for leaf in pytree.tree_leaves(list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]):
        node = leaf
        while isinstance(node, Node) and node.op == "call_function" and not is_dequantize(node) and _keeps_values(node):
            node = node.args[0]
        scales.append(_scale(node) if isinstance(node, Node) and is_dequantize(node) else None)
    return scales


def _keeps_values(node: Node) -> bool:
    """A view or copy between an output and its dequantize: the output holds the dequantized values."""
    return bool(node.args) and isinstance(node.args[0], Node) and op_name(node).split(".")[0] in (
        "view", "reshape", "_unsafe_view", "squeeze", "unsqueeze", "clone", "contiguous", "permute", "transpose",
        "expand", "flatten",
    )


def _scale(dequantize: Node) -> float | None:
    scale = dequantize.args[1] if len(dequantize.args) > 1 else dequantize.kwargs.get("scale")
    if isinstance(scale, Node) and scale.op == "get_attr":
        value = getattr(dequantize.graph.owning_module, str(scale.target), None)
        return float(value.max()) if isinstance(value, torch.Tensor) else None
    return float(scale) if isinstance(scale, (int, float)) else None


# --- what QNN built, per norm -----------------------------------------------------------------------------

def norm_ops(lowered) -> dict[str, list[tuple[str, str]]]:
    """For each module path, what its code became in the lowered program: ``(where, op)`` pairs, ``where``
    the delegate's backend (``QnnBackend``) with ``op`` the QNN op type QNN compiled the node as (the
    edge op's name when QNN's graph names no op after it), or ``"outside"`` with the edge op. Quantize
    and dequantize ops (QNN folds them into its tensors' encodings) and tuple access are left out."""
    graphs = lowered.graphs
    found: dict[str, list[tuple[str, str]]] = {}

    def visit(graph_module: GraphModule, where: str) -> None:
        for node in graph_module.graph.nodes:
            if node.op != "call_function" or node.target is operator.getitem or is_quantize(node) or is_dequantize(node):
                continue
            if "executorch_call_delegate" in str(node.target):
                delegate = getattr(graph_module, node.args[0].target)
                inner = getattr(getattr(delegate, "original_module", None), "graph_module", None)
                if inner is not None:
                    visit(inner, getattr(delegate, "backend_id", None) or "delegate")
                continue
            path = module_path(node)
            if path is None:
                continue
            op = op_name(node)
            if where == QNN_BACKEND:
                compiled = graphs.find(node.name)
                op = compiled[1].type if compiled is not None else op
            found.setdefault(path, []).append((where, op))

    visit(lowered.edge.exported_program().graph_module, OUTSIDE)
    return found


def module_path(node: Node) -> str | None:
    """The path of the innermost module whose code produced ``node``, from ``nn_module_stack``."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    return path.removeprefix("L['self'].").removeprefix("L__self__.") or None


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


def _counts(ops: list[str]) -> str:
    return ", ".join(f"{n}× {op}" if n > 1 else op for op, n in Counter(ops).most_common())

