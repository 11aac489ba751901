"""Small FX helpers that the core, the backends and the application share: one copy of each.

- :func:`module_path` and :func:`module_paths`: the module a node's code belongs to, from the
  ``nn_module_stack`` torch.export records (without the ``L['self'].`` prefix Dynamo adds);
  :func:`module_class_name`: that module's class name;
- :func:`dtype_name`: ``float16`` for ``torch.float16``, as messages and tables print a dtype;
- :class:`Recorder`: an interpreter that keeps some nodes' values as it runs and replaces others';
- :func:`top_graph`: the top-level graph module of a lowered program, an exported program or a graph;
- :func:`nodes_outside` and :func:`ops_outside`: what a lowered program runs outside every delegate (any
  backend's), the one definition the backends, the tools and the tests share.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping

import torch
from torch.fx import GraphModule, Interpreter, Node


def _clean(path: str) -> str:
    return path.removeprefix("L['self'].").removeprefix("L__self__.")


def module_path(node: Node) -> str | None:
    """The path of the innermost module whose code produced ``node`` (``model.layers.0.input_layernorm``),
    or None when export recorded none (or the node belongs to the root module)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    return _clean(list(stack.values())[-1][0]) or None


def module_paths(node: Node) -> set[str]:
    """The paths of every module ``node``'s code runs inside, outermost to innermost, as a set."""
    stack = node.meta.get("nn_module_stack") or {}
    return {_clean(path) for path, _ in stack.values()}


def module_class_name(node: Node) -> str | None:
    """The class name of the innermost module whose code produced ``node`` (``LlamaRMSNorm``), or None."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    _, cls = list(stack.values())[-1]
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
    return name.rsplit(".", 1)[-1].strip("'>")


def dtype_name(dtype: torch.dtype | None) -> str:
    """``float16`` for ``torch.float16``: a dtype as messages, tables and JSON write it."""
    return str(dtype).removeprefix("torch.")


class Recorder(Interpreter):
    """Runs a graph, keeping the values of the nodes named in ``record`` and replacing those named in ``replace``.

    Nodes are named, not passed, so that the values one graph records can stand in for the nodes of the
    same names in another. Each kept value is ``keep(value)`` at the moment its node runs (a copy, when
    a later in-place op may change the tensor); a replaced node's readers get the given value.
    """

    def __init__(
        self,
        gm: GraphModule,
        record: Collection[str] = (),
        replace: Mapping[str, Any] | None = None,
        keep: Callable[[Any], Any] | None = None,
    ):
        super().__init__(gm)
        self.record = set(record)
        self.replace = dict(replace or {})
        self.keep = keep or (lambda value: value)
        self.values: dict[str, Any] = {}

    def run_node(self, node: Node) -> Any:
        value = super().run_node(node)
        if node.name in self.record:
            self.values[node.name] = self.keep(value)
        return self.replace.get(node.name, value)


def top_graph(program: Any) -> GraphModule:
    """The top-level graph module of an ``EdgeProgramManager``, an ``ExportedProgram`` or a ``GraphModule``."""
    if isinstance(program, GraphModule):
        return program
    if hasattr(program, "exported_program"):
        return program.exported_program().graph_module
    return program.graph_module


#: The calls of a lowered graph that compute nothing: the delegate call, tuple access and, once
#: ``to_executorch`` has planned memory, the allocation of each out-variant kernel's output. ``alloc``
#: belongs here although an edge program (before ``to_executorch``) has none: in a planned graph, a list
#: without it would count every op outside a delegate twice.
_PLUMBING = frozenset({"executorch_call_delegate", "getitem", "alloc"})


def call_name(node: Node) -> str:
    """The name of what ``node`` calls: ``aten.mean.dim``, ``getitem``, ``executorch_call_delegate``."""
    return getattr(node.target, "__name__", str(node.target))


def is_plumbing(node: Node) -> bool:
    """Whether ``node`` calls plumbing (a delegate, tuple access, an allocation), not an op that computes."""
    return call_name(node) in _PLUMBING


def nodes_outside(program) -> list[Node]:
    """The nodes of a lowered program's top-level graph that run an op outside every delegate, in graph
    order: the one definition of "outside a delegate" that the tests, the tools and the command share."""
    return [n for n in top_graph(program).graph.nodes if n.op == "call_function" and not is_plumbing(n)]


def ops_outside(program) -> list[str]:
    """Names of the edge ops the top-level graph calls outside any delegate, in graph order (an out
    variant by its op's name)."""
    return [call_name(n).removesuffix(".out") for n in nodes_outside(program)]
