"""Bad input gets a clear error at the API, or norms left decomposed with a reason: never a crash."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import Dim, export

import edgefuse
from edgefuse.core.verify import compare
from tests.forms import LlamaNorm
from tests.harness import DIM_ORDER_MODES, MODES, cast_path, norm_input, exported, rewrite, rms_norm_nodes


def _x(dtype=torch.float16, shape=(2, 5, 16)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_a_graph_without_tensor_metadata_leaves_norms_with_a_reason(mode):
    target = exported(LlamaNorm().to(torch.float16), (_x(),), mode)
    graph_module = target if mode == "capture" else target.graph_module
    for node in graph_module.graph.nodes:
        node.meta.pop("val", None)
    result = edgefuse.recompose_rms_norm(target)
    [decision] = result.decisions
    assert not decision.rebuilt and "meta['val']" in decision.reason
    assert rms_norm_nodes(graph_module) == []


@pytest.mark.parametrize("mode", MODES)
def test_a_symbolic_normalized_shape_leaves_the_norm_with_a_reason(mode):
    class Norm(nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    width = Dim("width", min=2, max=64)
    rewritten = rewrite(Norm(), (_x(torch.float32),), mode, dynamic_shapes=({2: width},))
    [decision] = rewritten.result.decisions
    assert not decision.rebuilt and "symbolic" in decision.reason


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_symbolic_leading_dims_are_rebuilt_and_match_eager_at_several_sizes(mode):
    module = LlamaNorm().to(torch.float16)
    rows = Dim("rows", min=1, max=64)
    rewritten = rewrite(module, (_x(),), mode, dynamic_shapes=({1: rows},))
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ())  # the float16 input itself
    for size in (1, 7, 64):
        x = _x(shape=(2, size, 16))
        comparison = compare(module(x), rewritten.run(x))
        assert comparison.ok, comparison


_library = torch.library.Library("edgefuse_test", "DEF")
_library.define("to_float(Tensor x) -> Tensor")
_library.impl("to_float", lambda x: x.float(), "CompositeExplicitAutograd")
_library.impl("to_float", lambda x: torch.empty_like(x, dtype=torch.float32), "Meta")


class UnknownCastNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = LlamaNorm().weight

    def forward(self, x):
        h = torch.ops.edgefuse_test.to_float(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
def test_an_unknown_cast_is_never_walked_past(mode):
    module = UnknownCastNorm().to(torch.float16)
    rewritten = rewrite(module, (_x(),), mode)
    [decision] = rewritten.result.decisions
    assert not decision.rebuilt and "no tensor of the output dtype holds the input" in decision.reason
    assert compare(module(_x()), rewritten.run(_x()), ulps=0).ok


def test_an_empty_graph_has_no_decisions():
    class Identity(nn.Module):
        def forward(self, x):
            return x + 1

    result = edgefuse.recompose_rms_norm(export(Identity(), (_x(),)).module())
    assert result.decisions == []


def test_an_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown backend 'npu'.*aten, qnn"):
        edgefuse.recompose_rms_norm(export(LlamaNorm(), (_x(torch.float32),)).module(), backend="npu")


def test_a_module_that_is_not_a_graph_is_a_clear_error():
    with pytest.raises(TypeError, match="GraphModule or an ExportedProgram, not LlamaNorm"):
        edgefuse.recompose_rms_norm(LlamaNorm())


def test_a_flag_that_is_not_a_bool_is_a_clear_error():
    with pytest.raises(TypeError, match="quantization_capture is True or False, got 'no'"):
        edgefuse.recompose_rms_norm(export(LlamaNorm(), (_x(torch.float32),)).module(), quantization_capture="no")


def test_a_symbolically_traced_graph_is_a_clear_error_not_zero_decisions():
    from torch.fx import symbolic_trace

    with pytest.raises(ValueError, match="export the model with torch.export"):
        edgefuse.recompose_rms_norm(symbolic_trace(LlamaNorm()))


def test_quantization_capture_on_an_edge_graph_is_a_clear_error():
    program = exported(LlamaNorm(), (_x(torch.float32),), "edge")
    with pytest.raises(ValueError, match="holds ExecuTorch edge ops"):
        edgefuse.recompose_rms_norm(program, quantization_capture=True)


def test_an_edge_graph_without_its_program_says_eps_cannot_be_read():
    program = exported(LlamaNorm(), (_x(torch.float32),), "edge")
    result = edgefuse.recompose_rms_norm(program.graph_module)
    [decision] = result.decisions
    assert not decision.rebuilt and "pass the program" in decision.reason


def test_qnn_on_a_lifted_graph_without_its_program_cannot_tell_a_parameter_from_an_input():
    program = export(LlamaNorm().to(torch.float16), (_x(),))
    result = edgefuse.recompose_rms_norm(program.graph_module, backend="qnn")
    [decision] = result.decisions
    assert not decision.rebuilt and "pass the ExportedProgram" in decision.reason


def test_qnn_on_the_same_program_reads_its_parameters():
    module = LlamaNorm().to(torch.float16)
    program = export(module, (_x(),))
    result = edgefuse.recompose_rms_norm(program, backend="qnn")
    [decision] = result.decisions
    assert decision.rebuilt and decision.weight == "p_weight"
    [node] = rms_norm_nodes(program.graph_module)
    assert cast_path(norm_input(node)) == ("x", ())  # the float16 input itself
    assert compare(module(_x()), program.module()(_x())).ok
