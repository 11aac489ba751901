"""The pass objects work in ``EdgeProgramManager.transform`` and on ``ExportedProgram.module()`` graphs."""

from __future__ import annotations

import pytest
import torch
from torch.export import export

from executorch.exir import EdgeCompileConfig, to_edge

import edgefuse
from edgefuse.passes import RecomposeRmsNorm, RemoveRedundantCasts
from edgefuse.verify import compare
from forms import LlamaNorm
from harness import cast_path, rms_norm_nodes


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
    assert cast_path(node.args[0]) == ("x", ())
    assert [d.rebuilt for d in recompose.decisions] == [True]
    assert compare(module(_x()), program.module()(_x())).ok


def test_the_stock_edge_verifier_rejects_rms_norm_without_edgefuses_config():
    edge = to_edge(export(LlamaNorm(), (_x(torch.float32),)), compile_config=EdgeCompileConfig())
    with pytest.raises(Exception, match="rms_norm"):
        edge.transform([RecomposeRmsNorm()])


def test_the_pass_runs_on_a_module_graph_and_returns_a_pass_result():
    module = LlamaNorm().to(torch.bfloat16)
    graph = export(module, (_x(torch.bfloat16),)).module()
    result = RecomposeRmsNorm(backend="qnn", quantization_capture=True)(graph)
    assert result.modified and result.graph_module is graph
    assert len(rms_norm_nodes(graph)) == 1
    assert compare(module(_x(torch.bfloat16)), graph(_x(torch.bfloat16))).ok


def test_a_pass_that_changes_nothing_says_so():
    graph = export(LlamaNorm().to(torch.bfloat16), (_x(torch.bfloat16),)).module()
    recompose = RecomposeRmsNorm(backend="qnn")  # no bfloat16 outside quantization capture
    assert not recompose(graph).modified
    assert recompose.decisions and not recompose.decisions[0].rebuilt
