"""XNNPACK lowering two ways, stock and edgefuse, and a summary of what each lowered program holds.

Both lowerings live in :mod:`edgefuse.xnnpack.lowering` (stock is ExecuTorch's own
``to_edge_transform_and_lower`` with ``XnnpackPartitioner``). This module is the only place the command
line calls it, so a change of its API is a change of one line here, and a missing or broken package
becomes :class:`~edgefuse.inputs.errors.Unavailable` (the command says so) instead of a crash.

:func:`summarize` reads a lowered program's top-level graph: each ``executorch_call_delegate`` node is a
delegate, every other call that computes something (:func:`edgefuse.core._fx.is_plumbing`) is an
op left outside the delegates on a portable kernel, and the graph order of both gives the segments the
delegate map draws.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from torch.export import ExportedProgram
from torch.fx import Node

from edgefuse.core._fx import is_plumbing, top_graph
from edgefuse.inputs.errors import Unavailable

#: The two lowerings, as :mod:`edgefuse.xnnpack.lowering` names them (kept here as plain strings, so
#: that this module imports without that package).
STOCK = "stock"
EDGEFUSE = "edgefuse"


def _xnnpack():
    """The package :mod:`edgefuse.xnnpack` and its module ``lowering``;
    :class:`Unavailable` when the package is missing or fails to import."""
    try:
        import edgefuse.xnnpack as package
        from edgefuse.xnnpack import lowering
    except Exception as error:  # missing, or half-built: either way the command must say so, not crash
        raise Unavailable(f"edgefuse's XNNPACK lowering is unavailable: importing edgefuse.xnnpack failed "
                          f"({type(error).__name__}: {error})") from error
    return package, lowering


def stock_lower(program: ExportedProgram):
    """ExecuTorch's stock XNNPACK flow on ``program``, which stays as it was (see
    :func:`edgefuse.xnnpack.lowering.lower_stock`)."""
    return _xnnpack()[1].lower_stock(program)


def edgefuse_lower(program: ExportedProgram):
    """edgefuse's XNNPACK flow, the package's public ``edgefuse.xnnpack.lower``; raises :class:`Unavailable`
    when :mod:`edgefuse.xnnpack` is missing or fails to import."""
    return _xnnpack()[0].lower(program)


def build_xnnpack_patterns() -> None:
    """Build the subgraph patterns ExecuTorch's XNNPACK backend matches in every delegate it preprocesses.

    The backend builds them when it first needs them (it exports and converts a small module per
    pattern: seconds of CPU) and keeps them for the life of the process. Building them before a
    process forks a worker means that the worker and the process, each lowering one program, build them
    once between them. The lowered programs are the same either way.
    """
    try:
        from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa
    except ImportError:  # another ExecuTorch layout: each lowering builds what it needs, as without this
        return
    for build in (getattr(sdpa, "get_graphs", None), getattr(bilinear_2d, "get_graphs_dict", None)):
        if build is not None:
            build()


def lower_xnnpack(program: ExportedProgram, how: str):
    """Lower ``program`` with ``how`` (``"stock"`` or ``"edgefuse"``); returns an ``EdgeProgramManager``."""
    if how == STOCK:
        return stock_lower(program)
    if how == EDGEFUSE:
        return edgefuse_lower(program)
    raise ValueError(f"unknown lowering {how!r}; choose {STOCK!r} or {EDGEFUSE!r}")


@dataclass
class Segment:
    """A run of the top-level graph: one delegate, or consecutive ops left outside any delegate."""

    kind: str  # "delegate" or "outside"
    ops: list[str] = field(default_factory=list)
    backend: str | None = None  # the delegate's backend id, e.g. XnnpackBackend
    index: int | None = None  # the delegate's number in graph order, from 0


@dataclass
class DelegateSummary:
    """What one lowered program holds: delegates, the ops outside them, and the segments in graph order."""

    label: str
    segments: list[Segment]

    @property
    def delegates(self) -> int:
        return sum(1 for s in self.segments if s.kind == "delegate")

    @property
    def outside(self) -> list[str]:
        return [op for s in self.segments if s.kind == "outside" for op in s.ops]

    @property
    def backends(self) -> list[str]:
        return sorted({s.backend for s in self.segments if s.kind == "delegate" and s.backend})

    @property
    def splits(self) -> int:
        """Runs of outside ops that sit between two delegates: the places where the graph splits."""
        kinds = [s.kind for s in self.segments]
        return sum(
            1 for i, k in enumerate(kinds)
            if k == "outside" and "delegate" in kinds[:i] and "delegate" in kinds[i + 1:]
        )

    def outside_counts(self) -> Counter:
        return Counter(self.outside)

    def line(self) -> str:
        """``stock: 36 delegates, 107 ops outside (30 _to_dim_order_copy, 9 mean.dim, ...)``."""
        counts = ", ".join(f"{n} {op}" for op, n in self.outside_counts().most_common())
        return (
            f"{self.label}: {self.delegates} delegate{'s' if self.delegates != 1 else ''}, "
            f"{len(self.outside)} op{'s' if len(self.outside) != 1 else ''} outside"
            + (f" ({counts})" if counts else "")
        )


def summarize(manager, label: str, delegate_ops=None) -> DelegateSummary:
    """The :class:`DelegateSummary` of a lowered ``EdgeProgramManager`` (or its graph module).

    ``delegate_ops(name, lowered_module)`` gives the ops of a delegate when the backend says what it built
    (QNN: its own op types); by default they are the edge ops the delegate took in.
    """
    gm = top_graph(manager)
    segments: list[Segment] = []
    index = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if _is_delegate_call(node):
            lowered = getattr(gm, node.args[0].target)
            ops = delegate_ops(node.args[0].target, lowered) if delegate_ops is not None else None
            ops = ops if ops is not None else _delegate_ops(lowered)
            segments.append(Segment("delegate", ops, getattr(lowered, "backend_id", None), index))
            index += 1
        elif is_plumbing(node):
            continue
        elif segments and segments[-1].kind == "outside":
            segments[-1].ops.append(op_name(node))
        else:
            segments.append(Segment("outside", [op_name(node)]))
    return DelegateSummary(label, segments)


def op_name(node: Node) -> str:
    """A short op name: ``mean.dim``, ``_to_dim_order_copy``, ``unsqueeze_copy``."""
    name = getattr(node.target, "__name__", None) or str(node.target)
    name = name.removesuffix(".default").removesuffix(".out")
    for prefix in ("aten.", "dim_order_ops.", "quantized_decomposed.", "edgefuse."):
        name = name.removeprefix(prefix)
    return name


def _is_delegate_call(node: Node) -> bool:
    return "executorch_call_delegate" in str(node.target)


def _delegate_ops(lowered) -> list[str]:
    original = getattr(lowered, "original_module", None)
    gm = getattr(original, "graph_module", None)
    if gm is None:
        return []
    return [op_name(n) for n in gm.graph.nodes if n.op == "call_function" and not is_plumbing(n)]
