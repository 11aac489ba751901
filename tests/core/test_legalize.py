"""Whole norms held to a profile's shape limits (``legalize_rms_norm``): each ``rms_norm`` a graph holds is
kept, normalized on a ``[1, rows, D]`` view of its input and viewed back, or left with the reason.

A view changes no value, so a viewed norm must give eager's output bit for bit, in the dtype and layout the
graph had.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import export

from executorch.exir import to_edge

import edgefuse
from edgefuse.core.legalize import KEPT, LEFT, VIEWED, legalize_rms_norm
from edgefuse.core.profiles import FLOAT, PROFILES, QUANTIZED, Generation, ShapeLimit

from tests.harness import rms_norm_nodes

LAYOUT, RANK = "htp-fp16-rms-norm-layout", "htp-rms-norm-rank"
MODES = ("capture", "edge")


def _graph(module, inputs, mode, dynamic_shapes=None):
    """The captured graph, or the edge program with its ``rms_norm`` kept whole, as QNN's partitioner keeps it."""
    program = export(module, inputs, dynamic_shapes=dynamic_shapes)
    if mode == "capture":
        return program.module()
    config = edgefuse.edge_compile_config(preserve_ops=[torch.ops.aten.rms_norm.default])
    return to_edge(program, compile_config=config).exported_program()


def _run(target, inputs):
    return (target if isinstance(target, torch.fx.GraphModule) else target.module())(*inputs)


def _x(shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).mul(2).to(dtype)


def _without_limits():
    return dataclasses.replace(PROFILES["qnn"], limits=())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(1, 16, 4, 32), (2, 4, 16, 64), (3, 16, 128)])
def test_a_whole_norm_a_limit_covers_is_normalized_on_its_rows_and_viewed_back(mode, shape):
    module, inputs = nn.RMSNorm(shape[-1], eps=1e-6).eval(), (_x(shape, torch.float16),)
    module.to(torch.float16)
    target = _graph(module, inputs, mode)
    before = _run(target, inputs)
    [held] = legalize_rms_norm(target, backend="qnn").norms
    assert (held.action, held.limit, held.shape) == (VIEWED, LAYOUT, shape)
    assert "normalized on a [1, " in held.reason and LAYOUT in held.reason
    gm = target if mode == "capture" else target.graph_module
    [node] = rms_norm_nodes(gm)
    assert list(node.args[0].args[1]) == [1, shape[0] * shape[1] * (shape[2] if len(shape) == 4 else 1), shape[-1]]
    [user] = node.users
    assert list(user.args[1]) == list(shape) and user.meta["val"].stride() == before.stride()
    after = _run(target, inputs)
    assert after.dtype == before.dtype and after.stride() == before.stride() and torch.equal(after, before)
    if mode == "edge":
        target.validate()  # the signature names the view that now stands where the norm was
    # the rule removed: the same norm is kept as written
    [kept] = legalize_rms_norm(_graph(module, inputs, mode), backend=_without_limits()).norms
    assert kept.action == KEPT


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(1, 64, 32), (64, 32), (1, 1, 16, 64)])
def test_a_norm_no_limit_covers_is_kept_and_the_graph_is_unchanged(mode, shape):
    target = _graph(nn.RMSNorm(shape[-1]).eval(), (_x(shape),), mode)
    gm = target if mode == "capture" else target.graph_module
    code = gm.code
    [held] = legalize_rms_norm(target, backend="qnn").norms
    assert held.action == KEPT and held.limit is None
    assert held.reason == f"no limit of qnn covers {list(shape)} in {FLOAT}"
    assert gm.code == code
    if mode == "edge":
        target.validate()


def test_qnn_recompose_pass_views_a_whole_norm_at_the_graph_output_and_the_program_validates():
    inputs = (_x((2, 16, 32)),)
    config = edgefuse.edge_compile_config(preserve_ops=[torch.ops.aten.rms_norm.default])
    edge = to_edge(export(nn.RMSNorm(32).eval(), inputs), compile_config=config)
    before = edge.exported_program().module()(*inputs)
    transformed = edge.transform([edgefuse.qnn.QnnRecomposeRmsNorm()])  # ExecuTorch's verifier runs here
    program = transformed.exported_program()
    [node] = rms_norm_nodes(program.graph_module)
    assert list(node.args[0].args[1]) == [1, 32, 32]
    assert torch.equal(program.module()(*inputs), before)


class Transposed(nn.Module):
    """A norm over a transposed input: no ``[1, rows, D]`` view of it exists."""

    def forward(self, x):
        return F.rms_norm(x.transpose(1, 2), (32,), None, 1e-6)


def test_a_covered_norm_of_a_non_contiguous_input_is_left_with_the_reason():
    target = _graph(Transposed(), (_x((2, 16, 4, 32)),), "capture")
    code = target.code
    [held] = legalize_rms_norm(target, backend="qnn").norms
    assert held.action == LEFT and held.limit == LAYOUT
    assert held.reason.endswith("and this input is not contiguous, so it has no [1, rows, D] view")
    assert target.code == code


class SwappedUnitDim(nn.Module):
    """A norm over a transpose that swaps a dim of size 1: contiguous as torch counts it, yet its strides are
    not those of a ``[1, rows, D]`` view viewed back."""

    def forward(self, x):
        return F.rms_norm(x.transpose(1, 2), (32,), None, 1e-6)


def test_a_covered_norm_whose_view_would_change_its_output_strides_is_left():
    inputs = (_x((2, 16, 1, 32)),)
    target = _graph(SwappedUnitDim(), inputs, "capture")
    assert inputs[0].transpose(1, 2).is_contiguous()
    code, before = target.code, _run(target, inputs)
    [held] = legalize_rms_norm(target, backend="qnn").norms
    assert (held.action, held.limit) == (LEFT, LAYOUT)
    assert held.reason.endswith("a norm of its [1, rows, D] view would not produce the layout the graph expects")
    assert target.code == code and _run(target, inputs).stride() == before.stride()


class SeveralDims(nn.Module):
    """A norm over the last two dims: its rows are not ``[1, rows, D]``."""

    def forward(self, x):
        return F.rms_norm(x, (16, 32), None, 1e-6)


def test_a_covered_norm_over_several_trailing_dims_is_left_with_a_plain_reason():
    target = _graph(SeveralDims(), (_x((2, 4, 16, 32)),), "capture")
    code = target.code
    [held] = legalize_rms_norm(target, backend="qnn").norms
    assert (held.action, held.limit) == (LEFT, LAYOUT)
    assert held.reason.endswith("and it normalizes over several trailing dims: no [1, rows, D] view")
    assert target.code == code


def test_a_covered_norm_whose_rows_are_not_known_when_built_is_left():
    batch = torch.export.Dim("batch", min=2, max=8)
    target = _graph(nn.RMSNorm(32).eval(), (_x((2, 16, 32)),), "capture", dynamic_shapes=({0: batch},))
    [held] = legalize_rms_norm(target, backend="qnn").norms
    assert held.action == LEFT and held.reason.endswith("the rows of this one are not known when the program is built")


def test_a_limit_whose_remedy_is_leave_leaves_a_whole_norm_with_its_reason():
    leave = ShapeLimit("test-leave", frozenset({3}), None, 2, frozenset({FLOAT}), "leave", "a measurement")
    profile = dataclasses.replace(PROFILES["qnn"], limits=(leave,))
    [held] = legalize_rms_norm(_graph(nn.RMSNorm(32).eval(), (_x((2, 16, 32)),), "capture"), backend=profile).norms
    assert held.action == LEFT and "its remedy is 'leave'" in held.reason


def test_a_quantized_norm_of_a_precision_not_known_is_kept_and_the_reason_says_so():
    float_layout = _graph(nn.RMSNorm(32).eval(), (_x((1, 16, 4, 32)),), "capture")
    code = float_layout.code
    [held] = legalize_rms_norm(float_layout, backend="qnn", precision=QUANTIZED).norms
    assert held.action == KEPT and held.limit is None and float_layout.code == code
    # kept as written, yet not called safe: 8a8w was measured wrong on the float16 layout's shapes
    assert held.reason.startswith(f"no limit of qnn covers [1, 16, 4, 32] in {QUANTIZED}; yet {LAYOUT}: ")
    assert "the precision it is quantized at was not known to edgefuse" in held.reason
    assert "at 8a8w QNN was measured wrong on these shapes" in held.reason
    rank5 = _graph(nn.RMSNorm(64).eval(), (_x((1, 2, 4, 4, 64)),), "capture")
    [held] = legalize_rms_norm(rank5, backend="qnn", precision=QUANTIZED).norms
    assert (held.action, held.limit) == (VIEWED, RANK)


def test_at_8a8w_the_layout_limit_views_a_whole_norm_and_says_in_which_precision():
    target = _graph(nn.RMSNorm(32).eval(), (_x((1, 16, 4, 32)),), "capture")
    [held] = legalize_rms_norm(target, backend="qnn", precision="8a8w").norms
    assert (held.action, held.limit) == (VIEWED, LAYOUT)
    assert "wrong for an input of shape [1, 16, 4, 32] in 8a8w" in held.reason
    [norm] = [n for n in target.graph.nodes if n.target == torch.ops.aten.rms_norm.default]
    assert list(norm.args[0].meta["val"].shape) == [1, 64, 32]


@pytest.mark.parametrize(("precision", "generation"), [("16a4w", "V75"), ("16a4w", "V79"), ("16a8w", "V75"), ("16a16w", "V75")])
def test_a_precision_measured_right_on_the_generation_keeps_the_norm_with_no_note(precision, generation):
    target = _graph(nn.RMSNorm(32).eval(), (_x((1, 16, 4, 32)),), "capture")
    backend = PROFILES["qnn"].for_generation(generation)
    [held] = legalize_rms_norm(target, backend=backend, precision=precision).norms
    assert (held.action, held.reason) == (KEPT, f"no limit of qnn covers [1, 16, 4, 32] in {precision}")


@pytest.mark.parametrize(("precision", "generation", "where"), [
    ("16a8w", "V79", "on V75 only, not on V79"),
    ("16a16w", None, "on V75 only, not on a generation not named (no SoC given)"),
    ("16a4w", "V69", "on V75, V79 only, not on V69"),
])
def test_a_precision_measured_right_elsewhere_is_kept_with_where_it_was_measured(precision, generation, where):
    target = _graph(nn.RMSNorm(32).eval(), (_x((1, 16, 4, 32)),), "capture")
    backend = PROFILES["qnn"].for_generation(generation)
    [held] = legalize_rms_norm(target, backend=backend, precision=precision).norms
    assert held.action == KEPT and f"{LAYOUT}: {precision} was measured right on these shapes {where}" in held.reason


def test_a_precision_not_measured_is_kept_and_the_reason_says_so():
    target = _graph(nn.RMSNorm(32).eval(), (_x((1, 16, 4, 32)),), "capture")
    [held] = legalize_rms_norm(target, backend="qnn", precision="16a2w").norms
    assert held.action == KEPT and f"{LAYOUT}: 16a2w was not measured on these shapes" in held.reason


def test_8a4w_is_held_to_the_8a8w_layout_limit():
    """QNN annotates an 8a4w norm with 8-bit activations, as at 8a8w, where the layout was measured wrong."""
    target = _graph(nn.RMSNorm(32).eval(), (_x((1, 16, 4, 32)),), "capture")
    [held] = legalize_rms_norm(target, backend="qnn", precision="8a4w").norms
    assert (held.action, held.limit) == (VIEWED, LAYOUT)


class TwoNorms(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.RMSNorm(32), nn.RMSNorm(32)

    def forward(self, x):
        return self.second(self.first(x))


def test_a_function_gives_each_norm_its_own_precision():
    target = _graph(TwoNorms(), (_x((1, 16, 4, 32)),), "capture")
    by_node = {name: p for name, p in zip(("rms_norm", "rms_norm_1"), ("8a8w", "16a8w"))}
    held = legalize_rms_norm(target, backend="qnn", precision=lambda node: by_node[node.name]).norms
    assert [h.action for h in held] == [VIEWED, KEPT]


def test_an_unknown_precision_is_a_clear_error_and_changes_nothing():
    """Every norm's precision is checked before any is viewed: the first norm, at 8a8w, would be viewed,
    and the second's unknown precision leaves the graph as it was."""
    target = _graph(TwoNorms().eval(), (_x((1, 16, 4, 32)),), "capture")
    code, graph = target.code, str(target.graph)
    with pytest.raises(ValueError, match="unknown precision '4a4w': edgefuse knows fp16, 16a16w"):
        legalize_rms_norm(target, backend="qnn", precision="4a4w")
    by_node = {"rms_norm": "8a8w", "rms_norm_1": "int8"}
    with pytest.raises(ValueError, match="unknown precision 'int8'"):
        legalize_rms_norm(target, backend="qnn", precision=lambda node: by_node[node.name])
    assert (target.code, str(target.graph)) == (code, graph)


class Dequantized(nn.Module):
    """A norm of a dequantized tensor, as a converted (fake-quantized) graph holds it."""

    def forward(self, x):
        d = torch.ops.quantized_decomposed.dequantize_per_tensor(x, 0.01, 0, -32768, 32767, torch.int16)
        return F.rms_norm(d, (64,), None, 1e-6)


def test_a_norm_quantized_already_is_held_to_the_quantized_limits_and_never_viewed():
    xq = torch.randint(-100, 100, (1, 2, 4, 4, 64), dtype=torch.int16)
    target = _graph(Dequantized(), (xq,), "capture")
    [held] = legalize_rms_norm(target, backend="qnn").norms
    assert held.action == LEFT and held.limit == RANK
    assert "it is quantized already" in held.reason
    xq = torch.randint(-100, 100, (1, 16, 64), dtype=torch.int16)
    [held] = legalize_rms_norm(_graph(Dequantized(), (xq,), "capture"), backend="qnn").norms
    assert held.action == KEPT and held.reason == f"no limit of qnn covers [1, 16, 64] in {QUANTIZED}"


class QkNorm(nn.Module):
    """A decomposed norm the recomposition rebuilds, beside a whole one."""

    def __init__(self):
        super().__init__()
        self.whole = nn.RMSNorm(32, eps=1e-6)

    def forward(self, x, y):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h, self.whole(y)


def test_after_the_recomposition_a_rebuilt_norm_is_kept_and_a_whole_one_viewed():
    x, y = _x((1, 16, 4, 32)), _x((1, 16, 4, 32), torch.float32)
    target = _graph(QkNorm().eval(), (x, y), "edge")
    edgefuse.recompose_rms_norm(target, backend="qnn")  # rebuilt on its rows: the view is the limit's
    held = legalize_rms_norm(target, backend="qnn").norms
    assert [n.action for n in held] == [KEPT, VIEWED]
    assert held[1].node == "aten_rms_norm_default"


def test_a_generation_holds_the_limits_measured_on_it_and_an_unmeasured_one_every_limit():
    qnn = PROFILES["qnn"]
    assert {g.name for g in qnn.generations} >= {"V69", "V73", "V75", "V79", "V81"}
    assert qnn.for_generation("V75").limits == qnn.limits
    assert qnn.for_generation("V99").limits == qnn.limits and qnn.for_generation(None).limits == qnn.limits
    names = frozenset({LAYOUT, RANK})
    only_rank = dataclasses.replace(qnn, generations=(Generation("V75", ("SM8650",), names, frozenset({RANK})),))
    assert [l.name for l in only_rank.for_generation("V75").limits] == [RANK]
    # a limit not measured on a generation is held there
    unmeasured = dataclasses.replace(qnn, generations=(Generation("V75", ("SM8650",), frozenset({LAYOUT}), frozenset()),))
    assert [l.name for l in unmeasured.for_generation("V75").limits] == [RANK]
    assert [l.name for l in only_rank.for_generation("V79").limits] == [LAYOUT, RANK]
