"""Per-norm quantization facts: how each norm of a quantized graph was quantized, and what it costs.

Quantizers insert their quantize/dequantize pairs around the ops they annotate, so what a norm costs
depends on whether it reaches the quantizer as one ``rms_norm`` or as its pieces. :func:`mark_norms`
tags the nodes of every candidate norm (one per ``mean`` of a square, and every ``rms_norm``) before
``prepare_pt2e``; the tag is node metadata, which survives annotation, calibration and
``convert_pt2e``. :func:`norm_quantization` then reads the converted graph and says, per norm:

- ``how``: ``"one op"`` (one ``rms_norm`` the quantizer annotated, read through a dequantize and
  quantized at its output; casts of the model's kept around it, which a quantizer may round too, add
  their own pairs, and ``describe`` counts them), ``"pieces"`` (several ops, each output quantized),
  ``"partly"`` (some ops left in float, or one ``rms_norm`` the quantizer did not annotate: the pairs around it are its
  neighbours'), or ``"float"`` (no quantize/dequantize pair touches it);
- the quantize/dequantize pairs it costs: ``pairs_in`` (activations entering it), ``pairs_inside``
  (tensors it computes and reads again), ``pairs_out`` (tensors it computes and hands on) and
  ``pairs_constant`` (its weight and any scalar a quantizer lifted into a tensor, such as eps);
- ``views``: the ``[1, rows, D]`` views a backend's shape limit put around a rebuilt ``rms_norm``
  (:data:`~edgefuse.core.recompose.ROWS_VIEW`). They belong to the norm, and the pair the quantizer gives
  each (with its input's encoding: it rounds nothing) counts inside it; a norm of one ``rms_norm`` is
  still one op.

A pair is one quantize node (the dequantize nodes a converted graph duplicates per user share it), or
one folded constant read by a dequantize. An op's output is quantized when a reader of it quantizes it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from torch.fx import GraphModule, Node

from edgefuse.core._fx import module_path
from edgefuse.core.constants import GraphConstants
from edgefuse.core.match import Rejection, match_rms_norm
from edgefuse.core.ops import TABLES, Role, table_for
from edgefuse.core.paths import nodes_between
from edgefuse.core.recompose import ROWS_VIEW

#: ``node.meta`` key holding the key of the norm a node belongs to.
NORM_KEY = "edgefuse_norm"

#: ``node.meta`` key holding the name of the ``mean`` of the norm a node belongs to (in the graph as it
#: was first tagged), so a norm rebuilt after tagging keeps the nodes of its decomposed window that remain.
NORM_MEAN = "edgefuse_norm_mean"

#: ``node.meta`` key marking a cast that belongs to the dequantize it reads (see
#: :func:`edgefuse.qnn.quantizer.dequantize_in_float32`), as opposed to a cast of the model's.
DEQUANTIZE_CAST = "edgefuse_dequantize_cast"

#: ``node.meta`` key PT2E quantizers write their annotation under.
ANNOTATION_KEY = "quantization_annotation"


def is_dequantize(node: object) -> bool:
    """Whether ``node`` dequantizes (``dequantize_per_tensor``, ``dequantize_affine``, ... in either dialect)."""
    return isinstance(node, Node) and any(table.is_a(node, Role.DEQUANTIZE) for table in TABLES)


def is_quantize(node: object) -> bool:
    """Whether ``node`` quantizes (``quantize_per_tensor``, ``quantize_affine``, ... in either dialect)."""
    return isinstance(node, Node) and any(table.is_a(node, Role.QUANTIZE) for table in TABLES)


def _target_name(node: Node) -> str:
    return getattr(node.target, "__name__", None) or str(node.target)


def _is_cast(node: Node) -> bool:
    return bool(node.meta.get(DEQUANTIZE_CAST))


def dequantized(node: object) -> Node | None:
    """The dequantize behind ``node``: ``node`` itself, or the dequantize a :data:`DEQUANTIZE_CAST` reads."""
    if is_dequantize(node):
        return node
    if isinstance(node, Node) and _is_cast(node) and node.args and is_dequantize(node.args[0]):
        return node.args[0]
    return None


def readers(quantize: Node) -> list[Node]:
    """The nodes that read what ``quantize`` quantized: users of its dequantize nodes (past their casts)."""
    found = []
    for dq in quantize.users:
        if not is_dequantize(dq):
            continue
        for user in dq.users:
            found.extend(user.users if _is_cast(user) else [user])
    return found


def norm_key(path: str | None, mean: str, shared: bool = False) -> str:
    """A norm's name in reports and quantization facts: its module path, with its mean's name when the
    module computes more than one norm, or the mean's name alone when it has no module."""
    if not path:
        return mean
    return f"{path} ({mean})" if shared else path


def _key_of(node: Node, fallback: str) -> str:
    return module_path(node) or fallback


def _between(source: Node, sink: Node) -> set[Node]:
    """The nodes on a path from ``source`` to ``sink`` (``sink`` alone when there is none)."""
    return set(nodes_between(source, sink)) or {sink}


def _rows_views(norm: Node) -> list[Node]:
    """The views a backend's shape limit added around ``norm`` (:data:`~edgefuse.core.recompose.ROWS_VIEW`):
    the one it reads and the one that views its output back."""
    around = [norm.args[0], *norm.users] if norm.args else list(norm.users)
    return [n for n in around if isinstance(n, Node) and n.meta.get(ROWS_VIEW)]


def mark_norms(graph_module: GraphModule, decisions: Iterable = ()) -> dict[str, list[str]]:
    """Tag the nodes of every candidate norm with the norm's key; returns the tagged node names by key.

    Call it on the captured graph right before ``prepare_pt2e`` (after any recomposition). The key is
    :func:`norm_key`: the norm's module path (``model.layers.0.input_layernorm``), with its ``mean``
    node's name when the module computes more than one norm, or that name alone when the norm has no
    module of its own; ``decisions`` from :func:`edgefuse.recompose_rms_norm` give each
    rebuilt ``rms_norm`` the key its decomposed norm had, so keys match between a graph that was
    recomposed and one that was not.

    Tag the graph once before recomposing too: a rebuilt ``rms_norm`` then also takes the nodes of its
    decomposed norm's window that the rewrite kept and that lie on a path through it (the upcast it
    reads, the downcast after it), so a norm covers the same casts rebuilt or not, and its pairs and
    own error compare like for like.
    """
    gm = graph_module
    table = table_for(gm.graph)
    constants = GraphConstants(gm)
    by_node = {d.node: d for d in decisions if getattr(d, "rebuilt", False) and d.node}
    tagged_before: dict[str, list[Node]] = {}
    for node in gm.graph.nodes:
        mean = node.meta.pop(NORM_MEAN, None)
        node.meta.pop(NORM_KEY, None)
        if mean is not None:
            tagged_before.setdefault(mean, []).append(node)
    entries: list[tuple[str, str, set[Node]]] = []  # (key, mean, nodes), one per norm

    def add(key: str, mean: str, nodes: Iterable[Node]) -> None:
        nodes = {n for n in nodes if n.op == "call_function"}
        for k, _, known in entries:
            if k == key and (known & nodes or not known):
                known |= nodes
                return
        entries.append((key, mean, nodes))

    for node in list(gm.graph.nodes):
        if table.is_a(node, Role.RMS_NORM):
            decision = by_node.get(node.name)
            mean = decision.mean if decision is not None else node.name
            key = decision.module_path if decision is not None and decision.module_path else _key_of(node, mean)
            kept = tagged_before.get(mean, []) if decision is not None else []
            add(key, mean, [node, *_rows_views(node), *(n for n in kept if nodes_between(n, node) or nodes_between(node, n))])
        elif table.is_a(node, Role.MEAN):
            try:
                found = match_rms_norm(node, table, constants)
            except Exception:  # a graph the matcher cannot read leaves this mean unmarked
                continue
            key = _key_of(node, node.name)
            if isinstance(found, Rejection):
                nodes = set(found.nodes) or {node}
                if found.input is not None:
                    for end in found.nodes:
                        nodes |= _between(found.input, end)
                add(key, node.name, nodes)
                continue
            match = found[0]
            nodes = set(match.nodes) | _between(match.input, match.output)
            if match.weight is not None:
                nodes |= set(match.weight.chain)
            add(key, node.name, nodes)
    shared = Counter(key for key, _, _ in entries)
    groups = {}
    for key, mean, nodes in entries:
        name = norm_key(key, mean, shared[key] > 1)
        groups[name] = nodes
        for node in nodes:
            node.meta[NORM_KEY] = name
            node.meta[NORM_MEAN] = mean
    return {key: sorted(n.name for n in nodes) for key, nodes in groups.items()}


@dataclass(frozen=True)
class NormQuantization:
    """How one norm of a converted graph was quantized, and the quantize/dequantize pairs it costs."""

    key: str
    how: str
    ops: tuple[str, ...]
    quantized_ops: tuple[str, ...]
    annotated_ops: tuple[str, ...]
    pairs_in: int
    pairs_inside: int
    pairs_out: int
    pairs_constant: int
    nodes: tuple[str, ...] = field(default=(), repr=False)
    quantized_nodes: tuple[str, ...] = field(default=(), repr=False)
    views: int = 0

    @property
    def rebuilt(self) -> bool:
        """Whether the norm reached the quantizer as one ``rms_norm`` (a decomposed norm holds none)."""
        return "rms_norm" in self.ops

    @property
    def pairs(self) -> int:
        """Every quantize/dequantize pair the norm reads or writes, its constants included."""
        return self.pairs_in + self.pairs_inside + self.pairs_out + self.pairs_constant

    def describe(self) -> str:
        """One line a report can quote: ``one op (rms_norm): 1 pair in, 1 out, 1 constant``."""
        if self.how == "float":
            return f"float: {len(self.ops)} op{'s' if len(self.ops) != 1 else ''}, no quantize/dequantize pair"
        if self.how == "one op":
            views = self.views
            casts = len(self.ops) - 1 - views
            head = "one op (rms_norm)" + (f" with {casts} cast{'s' if casts != 1 else ''}" if casts else "")
            head += f" on a [1, rows, D] view ({views} views)" if views else ""
        elif self.how == "pieces":
            head = f"{len(self.ops)} ops quantized one by one ({', '.join(self.ops)})"
        elif len(self.ops) == 1 and not self.annotated_ops:
            head = f"one op ({self.ops[0]}), not annotated"
        else:
            floats = [op for op, node in zip(self.ops, self.nodes) if node not in self.quantized_nodes]
            head = (
                f"{len(self.ops)} op{'s' if len(self.ops) != 1 else ''}, {len(self.quantized_ops)} output quantized, "
                f"{len(floats)} in float" + (f" ({', '.join(floats)})" if floats else "")
            )
        return (
            f"{head}: {self.pairs_in} pair{'s' if self.pairs_in != 1 else ''} in, {self.pairs_inside} inside, "
            f"{self.pairs_out} out, {self.pairs_constant} constant"
        )


def _short(node: Node) -> str:
    """``rms_norm`` for ``aten.rms_norm.default``, ``mul`` for ``aten.mul.Tensor``, in either dialect."""
    name = _target_name(node)
    for prefix in ("aten.", "dim_order_ops.", "quantized_decomposed.", "edgefuse."):
        name = name.removeprefix(prefix)
    return name.split(".")[0]


def is_model_cast(node: Node) -> bool:
    """Whether ``node`` is one of the model's casts (``to``, ``type_as``, ...), which a rebuilt norm keeps."""
    return any(table.is_a(node, Role.CAST) for table in TABLES)


def _annotated(node: Node) -> bool:
    annotation = node.meta.get(ANNOTATION_KEY)
    return bool(annotation is not None and getattr(annotation, "_annotated", False))


def _quantizers_of(node: Node) -> list[Node]:
    return [u for u in node.users if is_quantize(u)]


def norm_quantization(graph_module: GraphModule, keys: Sequence[str] | None = None) -> list[NormQuantization]:
    """The quantization facts of every norm :func:`mark_norms` tagged, in graph order.

    ``graph_module`` is the graph after ``convert_pt2e`` (quantize/dequantize pairs in the graph).
    ``keys`` limits the result to those norms. A graph without tags gives an empty list: tag the
    graph before ``prepare_pt2e``.
    """
    groups: dict[str, list[Node]] = {}
    for node in graph_module.graph.nodes:
        key = node.meta.get(NORM_KEY)
        if key is None or node.op != "call_function" or is_quantize(node) or dequantized(node) is not None:
            continue
        if keys is not None and key not in keys:
            continue
        groups.setdefault(key, []).append(node)
    return [_facts(key, nodes) for key, nodes in groups.items()]


def _facts(key: str, compute: list[Node]) -> NormQuantization:
    members = set(compute)
    inside, out, entering, constant = set(), set(), set(), set()
    for node in compute:
        for q in _quantizers_of(node):
            (inside if any(r in members for r in readers(q)) else out).add(q)
        for arg in node.all_input_nodes:
            dq = dequantized(arg)
            if dq is None:
                continue
            source = dq.args[0] if dq.args else None
            if not isinstance(source, Node):
                continue
            if is_quantize(source):
                origin = source.args[0] if source.args else None
                if origin in members:
                    continue
                (constant if isinstance(origin, Node) and origin.op == "get_attr" else entering).add(source)
            elif source.op == "get_attr":
                constant.add(source)
            elif source.op == "placeholder":
                entering.add(source)
    quantized = [n for n in compute if _quantizers_of(n)]
    core = [n for n in compute if not is_model_cast(n) and not n.meta.get(ROWS_VIEW)]
    if not (inside or out or entering or constant):
        how = "float"
    elif len(core) == 1 and _short(core[0]) == "rms_norm" and _annotated(core[0]) and entering and _quantizers_of(core[0]):
        how = "one op"
    elif len(compute) > 1 and len(quantized) == len(compute):
        how = "pieces"
    else:
        how = "partly"
    return NormQuantization(
        key=key,
        how=how,
        ops=tuple(_short(n) for n in compute),
        quantized_ops=tuple(_short(n) for n in quantized),
        annotated_ops=tuple(_short(n) for n in compute if _annotated(n)),
        pairs_in=len(entering),
        pairs_inside=len(inside),
        pairs_out=len(out),
        pairs_constant=len(constant),
        nodes=tuple(n.name for n in compute),
        quantized_nodes=tuple(n.name for n in quantized),
        views=sum(1 for n in compute if n.meta.get(ROWS_VIEW)),
    )
