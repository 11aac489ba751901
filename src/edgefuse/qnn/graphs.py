"""What QNN built for a lowered program: the ops of each delegate's QNN graph, and where each norm went.

ExecuTorch's ``QnnBackend.preprocess`` turns each partition into QNN op configs (one or more per edge
node: an op builder may also build none, and drop the node without an error) and hands them to
``QnnManager.Compile``, whose context binary becomes the delegate's ``processed_bytes``. The ops are read
there, where QNN receives them: :func:`recording_compiled_graphs` records every compiled graph while a
lowering runs, and :func:`qnn_graphs` ties each to its delegate by those bytes.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator

from edgefuse.core._fx import call_name, nodes_outside
from edgefuse.core.recompose import Decision

#: The QNN op type a rebuilt norm becomes.
RMS_NORM = "RmsNorm"
#: How a quantized ``RmsNorm``'s output rounds: to the nearest level (edgefuse's builder gave it a
#: half-step beta: :mod:`edgefuse.qnn.visitors`), or down (the released builder's zero beta).
NEAREST, DOWN = "nearest", "down"
_RECORDING = threading.Lock()


@dataclass(frozen=True)
class QnnOp:
    """One op of a QNN graph: its name (the edge node's, for most builders), type and package, the shape
    and QNN data type of each input, and ``sources``: the names the edge node had in the graphs it was
    exported from (its ``from_node`` provenance), so a norm rebuilt in a captured graph can be found;
    ``rounding``, for a quantized ``RmsNorm``, how its output rounds (:data:`NEAREST` or :data:`DOWN`)."""

    name: str
    type: str
    package: str
    inputs: tuple[tuple[tuple[int, ...], str], ...] = ()
    sources: tuple[str, ...] = ()
    rounding: str | None = None


@dataclass(frozen=True)
class QnnGraph:
    """The QNN graph of one delegate: ``delegate`` is its lowered module's name in the program, ``method``
    the program's method that holds it."""

    delegate: str
    ops: tuple[QnnOp, ...]
    method: str = "forward"

    @property
    def rms_norms(self) -> int:
        return sum(1 for op in self.ops if op.type == RMS_NORM)

    def op_types(self) -> dict[str, int]:
        """How many ops of each type the graph holds."""
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.type] = counts.get(op.type, 0) + 1
        return counts


@dataclass(frozen=True)
class NormPlace:
    """Where one norm edgefuse decided on went: ``qnn_op`` is the QNN op its ``rms_norm`` became (with
    the ``delegate`` holding it), or None; ``outside`` names its nodes left outside every delegate;
    ``rounding`` how that op's quantized output rounds (:data:`NEAREST`, :data:`DOWN`; None in float)."""

    mean: str
    module_path: str | None
    rebuilt: bool
    qnn_op: str | None = None
    delegate: str | None = None
    outside: tuple[str, ...] = ()
    rounding: str | None = None


@dataclass
class QnnGraphs:
    """Every QNN graph of a lowered program, the ops left outside the delegates, and each norm's place.

    ``outside`` holds ``(node name, op)`` of each call outside a delegate (plumbing aside: :func:`edgefuse.core._fx.is_plumbing`);
    ``norms`` one :class:`NormPlace` per norm decision.
    """

    delegates: list[QnnGraph] = field(default_factory=list)
    outside: list[tuple[str, str]] = field(default_factory=list)
    norms: list[NormPlace] = field(default_factory=list)

    @property
    def rms_norms(self) -> int:
        """How many QNN ``RmsNorm`` ops the program's graphs hold."""
        return sum(g.rms_norms for g in self.delegates)

    def methods(self) -> dict[str, list[QnnGraph]]:
        """The graphs of each method, in the program's order of methods."""
        found: dict[str, list[QnnGraph]] = {}
        for graph in self.delegates:
            found.setdefault(graph.method, []).append(graph)
        return found

    def find(self, name: str) -> tuple[QnnGraph, QnnOp] | None:
        """The graph and op named ``name``, else the one whose edge node came from a node so named; None."""
        for match in (lambda op: op.name == name, lambda op: name in op.sources):
            for graph in self.delegates:
                for op in graph.ops:
                    if match(op):
                        return graph, op
        return None


@dataclass
class _Compiled:
    """``(graph name, ops, context binary)`` of each graph QNN compiled. A program of several methods is
    compiled in one call whose graphs, named after the methods, share one context binary."""

    graphs: list[tuple[str, list[QnnOp], bytes]] = field(default_factory=list)


def _describe(op_wrapper: Any, adaptor: Any) -> QnnOp:
    inputs = []
    for tensor in op_wrapper.GetInputTensors():
        wrapped = adaptor.PyQnnTensorWrapper(tensor)
        inputs.append((tuple(int(d) for d in wrapped.GetDims()), str(wrapped.GetDataType()).rsplit(".", 1)[-1]))
    return QnnOp(op_wrapper.GetName(), op_wrapper.GetOpType(), op_wrapper.GetPackageName(), tuple(inputs))


@contextlib.contextmanager
def recording_compiled_graphs() -> Iterator[_Compiled]:
    """Within the block, record every graph ExecuTorch's QNN backend hands to ``QnnManager.Compile``."""
    import executorch.backends.qualcomm.python.PyQnnManagerAdaptor as adaptor

    compiled = _Compiled()
    with _RECORDING:
        stock = adaptor.QnnManager.Compile

        def compile_and_record(manager, graph_names, op_wrappers, *args, **kwargs):
            binary = stock(manager, graph_names, op_wrappers, *args, **kwargs)
            processed = bytes(binary)
            for graph_name, ops in zip(graph_names, op_wrappers):
                compiled.graphs.append((str(graph_name), [_describe(op, adaptor) for op in ops], processed))
            return binary

        adaptor.QnnManager.Compile = compile_and_record
        try:
            yield compiled
        finally:
            adaptor.QnnManager.Compile = stock


def _lowered_modules(edge) -> list[tuple[str, str, Any]]:
    """``(method, name, LoweredBackendModule)`` of every QNN delegate of every method of ``edge``."""
    found = []
    for method in edge.methods:
        gm = edge.exported_program(method).graph_module
        for name, module in gm.named_children():
            if type(module).__name__ == "LoweredBackendModule" and getattr(module, "backend_id", "") == "QnnBackend":
                found.append((method, name if len(edge.methods) == 1 else f"{method}.{name}", module))
    return found


def _ops_of(compiled: _Compiled, processed: bytes, method: str) -> list[QnnOp]:
    """The ops of the graph compiled into the context binary ``processed`` for ``method``: of the graphs
    that binary holds, the one named after the method, else the only one."""
    graphs = [(name, ops) for name, ops, binary in compiled.graphs if binary == processed]
    named = [ops for name, ops in graphs if name == method]
    if named:
        return named[-1]
    return graphs[-1][1] if len(graphs) == 1 else []


def _outside(edge) -> list[tuple[str, str]]:
    """``(node name, op)`` of each call outside a delegate, in every method of ``edge``."""
    return [(n.name, call_name(n)) for m in edge.methods for n in nodes_outside(edge.exported_program(m))]


def _sources(node) -> tuple[str, ...]:
    """The names of the nodes ``node`` was made from, through every export and pass that recorded it."""
    names: list[str] = []
    work = list(node.meta.get("from_node") or ())
    while work and len(names) < 256:
        source = work.pop()
        if source.name not in names:
            names.append(source.name)
        work.extend(source.from_node or ())
    return tuple(names)


def _rounding(op: QnnOp, nearest: set[str]) -> str | None:
    """How a quantized ``RmsNorm``'s output rounds: to nearest when edgefuse's builder gave it the
    half-step beta (its name is in ``nearest``), else down; None for other ops and float norms."""
    if op.type != RMS_NORM or not (op.inputs and "FIXED_POINT" in op.inputs[0][1]):
        return None
    return NEAREST if op.name in nearest else DOWN


def qnn_graphs(edge, compiled: _Compiled, decisions: list[Decision] = (), nearest: Iterable[str] = ()) -> QnnGraphs:
    """What QNN built for the lowered ``edge``, from the graphs :func:`recording_compiled_graphs` recorded
    while it was lowered, and where each of ``decisions``' norms went; ``nearest`` names the norms
    edgefuse's ``RmsNorm`` builder gave a half-step beta (:attr:`edgefuse.qnn.passes.QnnPatch.nearest`)."""
    delegates = []
    nearest = set(nearest)
    for method, name, module in _lowered_modules(edge):
        sources = {n.name: _sources(n) for n in module.original_module.graph.nodes}
        ops = [replace(op, sources=sources.get(op.name, ()), rounding=_rounding(op, nearest))
               for op in _ops_of(compiled, bytes(module.processed_bytes), method)]
        delegates.append(QnnGraph(name, tuple(ops), method))
    graphs = QnnGraphs(delegates, _outside(edge))
    outside_names = {name for name, _ in graphs.outside}
    for decision in decisions:
        found = graphs.find(decision.node) if decision.node else None
        names = [n for n in (decision.node, decision.mean) if n]
        graphs.norms.append(NormPlace(
            decision.mean, decision.module_path, decision.rebuilt,
            found[1].type if found else None, found[0].delegate if found else None,
            tuple(n for n in names if n in outside_names), found[1].rounding if found else None,
        ))
    return graphs
