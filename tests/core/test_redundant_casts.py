"""Redundant-cast removal drops casts that change nothing and keeps every other."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import export

from executorch.exir import EdgeCompileConfig, to_edge
from executorch.exir.dialects._ops import ops as exir_ops

from edgefuse import remove_redundant_casts
from edgefuse.core.casts import dtype_of
from edgefuse.core.ops import Role, table_for
from edgefuse.core.verify import compare
from tests.forms import LlamaNorm


def _casts(graph_module):
    table = table_for(graph_module.graph)
    return [n for n in graph_module.graph.nodes if table.is_a(n, Role.CAST)]


def test_no_op_casts_are_removed():
    module = LlamaNorm()  # h.to(float32) on a float32 model, and h.to(x.dtype) back
    x = torch.randn(2, 16)
    graph = export(module, (x,)).module()
    assert len(_casts(graph)) == 2
    removed = remove_redundant_casts(graph)
    assert len(removed) == 2 and _casts(graph) == []
    assert compare(module(x), graph(x), ulps=0).ok


class EndsInACast(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = LlamaNorm()

    def forward(self, x):
        return self.norm(x).to(torch.float32)  # a no-op cast is the program's output


def test_an_exported_program_keeps_its_signature_in_step():
    x, module = torch.randn(2, 16), EndsInACast()
    program = export(module, (x,))
    output = program.graph_signature.output_specs[0].arg.name
    removed = remove_redundant_casts(program)
    assert output in removed and len(removed) == 3
    assert program.graph_signature.output_specs[0].arg.name != output
    program.validate()
    assert compare(module(x), program.module()(x), ulps=0).ok


def test_anything_else_is_a_type_error_before_any_change():
    for bad in (None, EndsInACast(), "graph"):
        with pytest.raises(TypeError, match="GraphModule or an ExportedProgram"):
            remove_redundant_casts(bad)


class MemoryFormatCasts(nn.Module):
    def forward(self, x):
        half = x.to(torch.float16, memory_format=torch.contiguous_format)  # changes the dtype and layout
        same = x.to(torch.float32, memory_format=torch.contiguous_format)  # changes the layout only
        return half, same * 2


def test_copies_with_a_memory_format_that_change_dtype_or_layout_are_kept_without_dim_order():
    x = torch.randn(1, 3, 4, 4).to(memory_format=torch.channels_last)
    edge = to_edge(export(MemoryFormatCasts(), (x,)), compile_config=EdgeCompileConfig(_skip_dim_order=True))
    graph = edge.exported_program().graph_module
    before = [(dtype_of(n), n.kwargs.get("memory_format")) for n in _casts(graph)]
    assert (torch.float16, torch.contiguous_format) in before
    assert remove_redundant_casts(graph) == []
    assert [(dtype_of(n), n.kwargs.get("memory_format")) for n in _casts(graph)] == before


class ReturnsItsInput(nn.Module):
    def forward(self, x):
        return x.to(torch.float32)


def test_a_no_op_cast_that_would_make_an_input_an_output_is_kept():
    # to_edge drops the model's own no-op cast, so put one back by hand between the input and the output.
    graph = to_edge(export(ReturnsItsInput(), (torch.randn(3),))).exported_program().graph_module
    x = next(n for n in graph.graph.nodes if n.op == "placeholder")
    output = next(n for n in graph.graph.nodes if n.op == "output")
    with graph.graph.inserting_before(output):
        cast = graph.graph.call_function(
            exir_ops.edge.dim_order_ops._to_dim_order_copy.default, (x,), {"dtype": torch.float32, "dim_order": [0]}
        )
    cast.meta["val"] = x.meta["val"]
    output.args = ((cast,),)
    graph.recompile()
    assert _casts(graph) == [cast]
    assert remove_redundant_casts(graph) == [] and _casts(graph) == [cast]


class ReturnsCopies(nn.Module):
    """Returns copies made by no-op casts, of another output and of a parameter, whole or through a view."""

    def __init__(self, view: bool = False):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4))
        self.view = view

    def forward(self, x):
        y = x * 2
        copies = y.to(torch.float32, copy=True), self.w.to(torch.float32, copy=True)
        return (y, *(c.view(2, 2) for c in copies)) if self.view else (y, *copies)


@pytest.mark.parametrize("view", [False, True])
def test_a_copy_the_model_returns_is_kept_so_no_output_aliases_another_or_a_parameter(view):
    module, x = ReturnsCopies(view), torch.ones(4)
    graph = export(module, (x,)).module()
    assert len(_casts(graph)) == 2
    assert remove_redundant_casts(graph) == [] and len(_casts(graph)) == 2
    first, copy, weight = graph(x)
    with torch.no_grad():
        first.add_(100)
        weight.add_(7)
    assert copy.flatten().tolist() == [2.0] * 4 and graph.w.tolist() == [0.0] * 4
