"""Remove casts that change nothing, and keep every cast that changes a dtype or a dim order.

A cast is redundant only when its output's metadata equals its input's: dtype, shape, layout, device and
dim order. Keyword arguments do not decide it: ``_to_copy(x, dtype=float16, memory_format=...)`` on a
float32 tensor changes the dtype whatever its memory format says, and must stay. A cast that copies is
kept too in a graph with in-place ops (a captured graph may keep them), and wherever the copy, or a view
of it, is an output: with the copy gone, a write to one tensor would reach the other (an output would be
another output, a parameter or an input, where the model returned a tensor of its own).
"""

from __future__ import annotations

from torch.export import ExportedProgram
from torch.fx import GraphModule

from edgefuse.core.casts import cast_source, is_noop_cast
from edgefuse.core.mutation import Mutations, reaches_an_output, returns_an_alias
from edgefuse.core.ops import Role, table_for
from edgefuse.core.signature import sync_signature


def remove_redundant_casts(graph_module: GraphModule | ExportedProgram) -> list[str]:
    """Remove no-op casts in place (and the metadata assertions on them); the names of those removed.

    ``graph_module`` is a graph module, or an ``ExportedProgram`` whose graph and signature are updated.
    """
    if isinstance(graph_module, ExportedProgram):
        program = graph_module
        removed = remove_redundant_casts(program.graph_module)
        if removed:
            sync_signature(program)
        return removed
    if not isinstance(graph_module, GraphModule):
        raise TypeError(
            "remove_redundant_casts takes a torch.fx.GraphModule or an ExportedProgram, not "
            f"{type(graph_module).__name__}"
        )
    table = table_for(graph_module.graph)
    removed = []
    in_place = bool(Mutations(graph_module.graph))
    for node in list(graph_module.graph.nodes):
        if not table.is_a(node, Role.CAST):  # what is_noop_cast asks first, without its other questions
            continue
        if not is_noop_cast(node, table) or _would_return_an_input(node, table):
            continue
        if not returns_an_alias(node) and (in_place or reaches_an_output(node)):
            continue
        for user in [u for u in node.users if table.is_a(u, Role.ASSERT_METADATA)]:
            graph_module.graph.erase_node(user)
        node.replace_all_uses_with(cast_source(node, table))
        graph_module.graph.erase_node(node)
        removed.append(node.name)
    if removed:
        graph_module.graph.lint()
        graph_module.recompile()
    return removed


def _would_return_an_input(node, table) -> bool:
    """Whether removing the cast would make a graph input a graph output, which ExecuTorch rejects."""
    return cast_source(node, table).op == "placeholder" and any(u.op == "output" for u in node.users)
