"""The pass objects work in ``EdgeProgramManager.transform`` and on ``ExportedProgram.module()`` graphs."""

from __future__ import annotations

import pytest
from torch._export.verifier import SpecViolationError
import torch
from torch.export import export

from executorch.exir import EdgeCompileConfig, to_edge

import edgefuse
from edgefuse.core.passes import RecomposeRmsNorm, RemoveRedundantCasts
from edgefuse.core.verify import compare
from tests.forms import LlamaNorm
from tests.harness import cast_path, norm_input, rms_norm_nodes


def _x(dtype=torch.float16, shape=(2, 5, 16)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def test_transform_rebuilds_norms_in_an_edge_program():
    module = LlamaNorm().to(torch.float16)
    config = edgefuse.edge_compile_config()
    edge = to_edge(export(module, (_x(),)), compile_config=config)
    recompose = RecomposeRmsNorm(backend="qnn")
    edge = edge.transform([RemoveRedundantCasts(), recompose], compile_config=config)
    program = edge.exported_program()
    [node] = rms_norm_nodes(program.graph_module)
    assert cast_path(norm_input(node)) == ("x", ())
    assert [d.rebuilt for d in recompose.decisions] == [True]
    assert compare(module(_x()), program.module()(_x())).ok


def test_the_stock_edge_verifier_rejects_rms_norm_without_edgefuses_config():
    edge = to_edge(export(LlamaNorm(), (_x(torch.float32),)), compile_config=EdgeCompileConfig())
    with pytest.raises(SpecViolationError, match="rms_norm.default is not in Core ATen"):
        edge.transform([RecomposeRmsNorm()])


def test_the_pass_runs_on_a_module_graph_and_returns_a_pass_result():
    module = LlamaNorm().to(torch.bfloat16)
    graph = export(module, (_x(torch.bfloat16),)).module()
    result = RecomposeRmsNorm(backend="qnn", quantization_capture=True)(graph)
    assert result.modified and result.graph_module is graph
    [node] = rms_norm_nodes(graph)
    assert cast_path(norm_input(node)) == ("x", ())  # the bfloat16 input itself
    assert compare(module(_x(torch.bfloat16)), graph(_x(torch.bfloat16))).ok


def test_a_pass_that_changes_nothing_says_so():
    graph = export(LlamaNorm().to(torch.bfloat16), (_x(torch.bfloat16),)).module()
    recompose = RecomposeRmsNorm(backend="qnn")  # no bfloat16 outside quantization capture
    assert not recompose(graph).modified
    assert recompose.decisions and not recompose.decisions[0].rebuilt


def test_weights_folded_in_two_runs_over_one_program_keep_their_own_constants():
    from tests.forms import GemmaNorm

    class TwoNorms(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = GemmaNorm(), GemmaNorm()
            self.b.weight.data = -self.b.weight.data

        def forward(self, x, y):
            return self.a(x), self.b(y)

    module = TwoNorms()
    inputs = (_x(torch.float32), _x(torch.float32, (3, 16)))
    edge = to_edge(export(module, inputs), compile_config=edgefuse.edge_compile_config())
    # The first run rebuilds only the first norm (the second reads a graph input edgefuse is told to skip).
    first = RecomposeRmsNorm(backend="qnn")
    program = edge.exported_program()
    second_mean = [n for n in program.graph.nodes if "mean" in n.name][1]
    second_mean.meta["val"], kept = None, second_mean.meta["val"]
    edge = edge.transform([first], compile_config=edgefuse.edge_compile_config())
    second_mean.meta["val"] = kept
    edge = edge.transform([RecomposeRmsNorm(backend="qnn")], compile_config=edgefuse.edge_compile_config())
    program = edge.exported_program()
    nodes = rms_norm_nodes(program.graph_module)
    assert [cast_path(norm_input(n)) for n in nodes] == [("x", ()), ("y", ())]
    weights = [n.args[2].name for n in nodes]
    assert len(weights) == 2 and len(set(weights)) == 2
    for expected, actual in zip(module(*inputs), program.module()(*inputs)):
        assert compare(expected, actual).ok


def test_dead_node_erasure_keeps_ops_edgefuse_does_not_know():
    """A dead op of unknown purity (it may write state) survives; the dead cast that fed nothing else goes."""
    from edgefuse.core.ops import table_for
    from edgefuse.core.recompose import _erase_dead

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    unknown = graph.call_function(torch.ops.aten.add_.Tensor, (x, 1.0))
    cast = graph.call_function(torch.ops.aten._to_copy.default, (x,), {"dtype": torch.float16})
    graph.output(x)
    _erase_dead([unknown, cast], table_for(graph))
    assert [n.op for n in graph.nodes] == ["placeholder", "call_function", "output"]
    assert not unknown._erased and cast._erased


def test_the_manager_a_transform_was_called_on_still_runs():
    """ExecuTorch's transform copies the program shallowly (graph and signature shared with the result):
    a folded weight must reach the constants both programs read."""
    from tests.forms import GemmaNorm

    module, x = GemmaNorm(), _x(torch.float32)
    config = edgefuse.edge_compile_config()
    old = to_edge(export(module, (x,)), compile_config=config)
    new = old.transform([RecomposeRmsNorm(backend="qnn")], compile_config=config)
    assert rms_norm_nodes(new.exported_program().graph_module)
    for manager in (old, new):
        assert compare(module(x), manager.exported_program().module()(x)).ok
