"""In-place ops in captured graphs: where a tensor read at one node may hold other values at another.

Graphs from ``export(...).module()`` keep in-place ops (``add_``, ``copy_``, ``index_put_``) on inputs,
buffers and intermediate tensors; edge graphs are functional. A rewrite that moves a read past such an
op, freezes a buffer the model writes into a constant, or removes a cast that copies would change what
the model computes, so the passes ask this module first. The answers are conservative: an op whose
effects edgefuse cannot read from a schema (a higher-order op) counts as writing everything it reads.
"""

from __future__ import annotations

import operator
from typing import Iterable

import torch
from torch.fx import Graph, Node


def is_in_place(node: Node) -> bool:
    """Whether the node may write to a tensor it reads."""
    if node.op != "call_function":
        return False
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.is_mutable
    return isinstance(node.target, torch._ops.HigherOrderOperator)


def returns_an_alias(node: Node) -> bool:
    """Whether the node's output may share storage with its first input (a view, or ``to`` without a copy)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    schema = node.target._schema
    if not schema.returns or schema.returns[0].alias_info is None:
        return False
    return not schema_argument(node, "copy", False)


def _is_view_of_first_input(node: Node) -> bool:
    """Whether the node is a view of its first input: an aliasing op, or one piece of a split, chunk or unbind
    (a getitem of a list of views)."""
    return returns_an_alias(node) or (node.op == "call_function" and node.target is operator.getitem)


def reaches_an_output(node: Node) -> bool:
    """Whether the graph returns the tensor ``node`` makes, itself or a view of it: a caller may then write it."""
    work, seen = [node], set()
    while work:
        current = work.pop()
        if current in seen:
            continue
        seen.add(current)
        for user in current.users:
            if user.op == "output":
                return True
            if _is_view_of_first_input(user) and user.args and user.args[0] is current:
                work.append(user)
    return False


def schema_argument(node: Node, name: str, default: object = None) -> object:
    """An argument of an ``OpOverload`` call by its schema name, positional or keyword, or ``default`` when
    the call leaves it out: ops that hold an argument at different positions (a per-tensor and a
    per-channel quantize) are read alike."""
    for i, argument in enumerate(node.target._schema.arguments):
        if argument.name == name:
            return node.args[i] if i < len(node.args) else node.kwargs.get(name, default)
    return default


def _written_args(node: Node) -> list[Node]:
    """The tensors an in-place op writes: those its schema marks as written, or every input of a higher-order op."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return list(node.all_input_nodes)
    written = []
    for argument in node.target._schema.arguments:
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = schema_argument(node, argument.name)
        written.extend(v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, Node))
    return written


class Mutations:
    """The in-place ops of one graph, in program order, and the tensors they may write."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._order: dict[Node, int] | None = None
        targets: dict[int, bool] = {}  # by target: reading an op's schema is costly, and few ops recur
        self.in_place = []
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            key = id(node.target)
            if key not in targets:
                targets[key] = is_in_place(node)
            if targets[key]:
                self.in_place.append(node)
        self.written: set[Node] = set()
        for node in self.in_place:
            for target in _written_args(node):
                self._add_with_bases(target)

    def _add_with_bases(self, node: Node) -> None:
        """Mark ``node`` written, and the tensors it is a view of, since a write through a view writes them."""
        while node not in self.written:
            self.written.add(node)
            # one piece of a split, chunk or unbind (getitem of a list of views) is a view of the whole
            if not _is_view_of_first_input(node) or not node.args or not isinstance(node.args[0], Node):
                return
            node = node.args[0]

    def __bool__(self) -> bool:
        return bool(self.in_place)

    def is_written(self, node: Node) -> bool:
        """Whether an in-place op may change the values ``node`` holds: it writes ``node``, a view of it, or
        a tensor ``node`` is a view of (a write through any view marks its bases too)."""
        seen = set()
        while node not in seen:
            if node in self.written:
                return True
            seen.add(node)
            if not _is_view_of_first_input(node) or not node.args or not isinstance(node.args[0], Node):
                return False
            node = node.args[0]
        return False

    def between(self, reads: Iterable[Node], last: Node) -> Node | None:
        """The first in-place op after the earliest of ``reads`` and before ``last``, or None."""
        if not self.in_place:
            return None
        reads = list(reads)
        if self._order is None or any(node not in self._order for node in [*reads, last]):
            # first asked, or nodes added since: number the graph (again)
            self._order = {node: i for i, node in enumerate(self.graph.nodes)}
        order = self._order
        first = min(order[node] for node in reads)
        end = order[last]
        return next((node for node in self.in_place if first < order[node] < end), None)
