"""Constant tensors of a graph: parameters, buffers and lifted constants, lifted or not.

A graph from ``ExportedProgram.module()`` reads constants through ``get_attr``; the graph of an
``ExportedProgram`` (and of every edge program) reads them as placeholders that only the program's
signature tells apart from user inputs. :class:`GraphConstants` answers both the same way.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from executorch.backends.transforms.utils import create_constant_placeholder, get_param_tensor, is_param_node
from torch.export.graph_signature import InputKind

from edgefuse.core.casts import cast_source, changes_only_dtype, dtype_of
from edgefuse.core.mutation import Mutations
from edgefuse.core.ops import OpTable, Role


class GraphConstants:
    """Looks up and adds constant tensors of one graph, with its exported program when there is one."""

    def __init__(self, graph_module: GraphModule, program: ExportedProgram | None = None):
        self.graph_module = graph_module
        self.program = program
        self.mutations = Mutations(graph_module.graph)
        self._count = 0
        self._fake_mode: object = None
        self._fake_mode_found = False

    def is_constant(self, node: object) -> bool:
        """Whether the node is a tensor known when the program is built."""
        if not isinstance(node, Node):
            return False
        # A buffer the graph writes in place, or the program updates, is state, not a constant: folding it
        # would freeze its first value. (torch.export keeps in-place ops on buffer placeholders, with
        # ``buffers_to_mutate`` empty, until the program is decomposed.)
        if self.mutations.is_written(node):
            return False
        if node.op == "get_attr":
            return True
        if node.op != "placeholder" or self.program is None or not is_param_node(self.program, node):
            return False
        signature = self.program.graph_signature
        return signature.inputs_to_buffers.get(node.name) not in signature.buffers_to_mutate.values()

    def source_kind(self, node: Node) -> str | None:
        """What a graph input or attribute that is not a constant holds: ``"user input"``, ``"written state"``
        (a parameter or buffer the graph or program writes), or None when the graph alone cannot tell."""
        if node.op not in ("placeholder", "get_attr"):
            return None
        if self.mutations.is_written(node) or (
            self.program is not None and node.name in self.program.graph_signature.inputs_to_buffers
        ):
            return "written state"
        if node.op == "get_attr":
            return None
        if self.program is not None:
            return "user input" if node.name in self.program.graph_signature.user_inputs else None
        # ``ExportedProgram.module()`` reads every parameter and buffer through get_attr, and records the
        # user inputs' structure as ``_in_spec``: there a placeholder can only be a user input.
        return "user input" if hasattr(self.graph_module, "_in_spec") else None

    def value(self, node: object) -> torch.Tensor | None:
        """The tensor behind a constant node, or None when it is not a constant or cannot be read."""
        if not self.is_constant(node):
            return None
        try:
            if node.op == "get_attr":
                value = self.graph_module
                for part in node.target.split("."):
                    value = getattr(value, part)
            else:
                value = get_param_tensor(self.program, node)
        except (AttributeError, RuntimeError, KeyError):
            return None
        return value if isinstance(value, torch.Tensor) else None

    def fold(self, node: object, table: OpTable) -> torch.Tensor | None:
        """The value of a constant, or of casts and scalar additions of one, computed as the graph would."""
        if not isinstance(node, Node):
            return None
        if self.is_constant(node):
            return self.value(node)
        if node.op != "call_function" or not table.is_a(node, Role.CAST, Role.ADD):
            return None
        if table.is_a(node, Role.CAST) and changes_only_dtype(node, table):
            # only the dtype matters: a cast to another tensor's dtype (type_as(x)) reads x for its dtype alone
            value = self.fold(cast_source(node, table), table)
            return None if value is None else value.to(dtype_of(node))
        args = []
        for arg in node.args:
            value = self.fold(arg, table) if isinstance(arg, Node) else arg
            if value is None:
                return None
            args.append(value)
        with torch.no_grad():
            return node.target(*args, **node.kwargs)

    def scalar(self, arg: object, table: OpTable) -> float | None:
        """A Python number, or the value of a one-element constant (or folded) tensor; None otherwise."""
        if isinstance(arg, bool):
            return None
        if isinstance(arg, (int, float)):
            return float(arg)
        value = self.fold(arg, table)
        if value is None or value.numel() != 1 or value.dtype.is_complex or value.dtype == torch.bool:
            return None
        return float(value.detach().reshape(()).item())

    def _fake_like(self, reference: Node, data: torch.Tensor) -> torch.Tensor:
        """A fake tensor for ``data`` in the fake mode of the graph's metadata, or ``data`` itself.

        The mode is found once per graph: every tensor the graph's metadata holds, and every one the
        passes add, belongs to it.
        """
        from torch._guards import detect_fake_mode

        if not self._fake_mode_found:
            vals = [n.meta.get("val") for n in reference.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
            self._fake_mode, self._fake_mode_found = detect_fake_mode(vals), True
        mode = self._fake_mode
        return mode.from_tensor(data, static_shapes=True) if mode is not None else data

    def add(self, name: str, data: torch.Tensor, before: Node) -> Node:
        """A new constant node holding ``data``; a get_attr before ``before``, or a lifted constant.

        It holds a copy outside autograd: folded from a parameter, ``data`` may require grad (torch warns
        on every call of the program then) or be the parameter itself.
        """
        data = data.detach().clone()
        graph = self.graph_module.graph
        self._count += 1
        if self.program is None:
            attr = f"_edgefuse_{name}_{self._count}"
            while hasattr(self.graph_module, attr):
                self._count += 1
                attr = f"_edgefuse_{name}_{self._count}"
            self.graph_module.register_buffer(attr, data)
            with graph.inserting_before(before):
                node = graph.get_attr(attr)
            node.meta["val"] = self._fake_like(before, data)
            return node
        taken = {n.name for n in graph.nodes} | {n.meta.get("requested_name") for n in graph.nodes}
        taken |= set(self.program.constants) | set(self.program.state_dict)
        while f"_edgefuse_{name}_{self._count}" in taken:
            self._count += 1
        first_input = next(n for n in graph.nodes if n.op == "placeholder")
        with graph.inserting_before(first_input):
            return create_constant_placeholder(
                self.program, graph, f"_edgefuse_{name}_{self._count}", InputKind.CONSTANT_TENSOR, data
            )
