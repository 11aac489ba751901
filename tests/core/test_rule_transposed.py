"""Rule 9: a norm over a permuted view (a QK norm after ``transpose(1, 2)``) is rebuilt on the tensor the
view reads and permuted after it, so its output keeps the model's shape and strides; near misses stay.

Every rebuilt case compares the program with eager on the same inputs at the tolerance
tests/core/test_forms.py derives for the form and dtype, says which tensor the new node reads, and checks the
output's strides, in the graph's metadata and in the tensors the program returns.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import Dim

import edgefuse
import edgefuse.core.recompose
from edgefuse.core.recompose import UNREADABLE
from edgefuse.core.verify import compare
from tests.core.test_forms import FORMS, ONE_ROUNDING_MORE, allowed_units, assert_matches_eager, build
from tests.core.rule_checks import assert_left
from tests.forms import EPS, GemmaNorm, LlamaNorm
from tests.harness import DTYPES, cast_path, norm_input, exported, rewrite, rms_norm_nodes

#: How the model reorders [B, T, H, D] into [B, H, T, D] before its norm, as models write it.
VIEWS = {
    "transpose(1, 2)": lambda x: x.transpose(1, 2),
    "transpose(-3, -2)": lambda x: x.transpose(-3, -2),
    "permute(0, 2, 1, 3)": lambda x: x.permute(0, 2, 1, 3),
    "movedim(2, 1)": lambda x: x.movedim(2, 1),
    "swapaxes(1, 2)": lambda x: x.swapaxes(1, 2),
}


class QKNorm(nn.Module):
    """A norm over the head dim of ``view(x)``: Gemma 3, Hunyuan, EXAONE 4, mllama and T5Gemma 2 normalize
    ``q_proj(h).view(B, T, H, D).transpose(1, 2)`` so."""

    def __init__(self, norm: nn.Module, view=VIEWS["transpose(1, 2)"]):
        super().__init__()
        self.norm, self.view = norm, view

    def forward(self, x):
        return self.norm(self.view(x))


def _x(dtype=torch.float32, shape=(2, 512, 4, 16), seed=0):
    """[B, T, H, D] with many rows, so that the rarer worst roundings occur."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).mul(3).to(dtype)


def _permute_after(node):
    """The one user of a rebuilt ``rms_norm``: the model's permutation, now of the norm's output."""
    [user] = node.users
    return user


def assert_keeps_the_layout(rewritten, inputs, user_target):
    """The rebuilt norm is followed by the model's permutation, whose output has the model's strides, in the
    graph's metadata and in the tensor the program returns."""
    [node] = rms_norm_nodes(rewritten.graph_module)
    after = _permute_after(node)
    assert after.target == user_target, after.target
    expected = rewritten.module(*inputs)
    actual = rewritten.run(*inputs)
    assert actual.shape == expected.shape and actual.stride() == expected.stride(), (actual.stride(), expected.stride())
    strides = tuple(after.meta["val"].stride())
    if all(isinstance(s, int) for s in strides):  # symbolic strides: see the dynamic test
        assert strides == expected.stride()
    return node


#: The forms a QK norm is written in: every registry form but the grouped one, which splits the last dim
#: into groups of its own width (Mamba2's gated norm, never a QK norm; rule 8 has its own tests).
QK_FORMS = [form for form in FORMS if form != "grouped"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", QK_FORMS)
def test_rule_a_norm_over_a_transposed_view_is_rebuilt_before_it_and_keeps_the_layout(form, dtype):
    module, inputs = QKNorm(build(form, dtype)).to(dtype), (_x(dtype),)
    rewritten = rewrite(module, inputs, "capture")
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    if module(*inputs).is_contiguous():
        # ``rsqrt(m) * x`` takes the layout of its first operand, the contiguous root: a norm rebuilt on the
        # transposed view itself already keeps it, and rule 9 does not apply
        assert form == "rsqrt-left"
        [node] = rms_norm_nodes(rewritten.graph_module)
        assert node.args[0].target == torch.ops.aten.transpose.int and decision.note is None
        assert rewritten.run(*inputs).stride() == module(*inputs).stride()
    else:
        assert decision.input == "x" and "permuted by transpose" in decision.note
        node = assert_keeps_the_layout(rewritten, inputs, torch.ops.aten.transpose.int)
        # the new node reads the model's input itself, before the transpose, in the model's dtype
        assert cast_path(norm_input(node)) == ("x", ()) and node.args[0].op == "placeholder"
    assert node.args[1] == [16] and node.meta["val"].dtype == dtype
    assert_matches_eager(module, inputs, rewritten, allowed_units(form, dtype))


#: The op and arguments each view is captured as.
CAPTURED = {
    "transpose(1, 2)": (torch.ops.aten.transpose.int, (1, 2)),
    "transpose(-3, -2)": (torch.ops.aten.transpose.int, (-3, -2)),
    "permute(0, 2, 1, 3)": (torch.ops.aten.permute.default, ([0, 2, 1, 3],)),
    "movedim(2, 1)": (torch.ops.aten.movedim.int, (2, 1)),
    "swapaxes(1, 2)": (torch.ops.aten.swapaxes.default, (1, 2)),
}


@pytest.mark.parametrize("view", VIEWS)
def test_rule_every_op_that_reorders_the_other_dims_is_taken(view):
    module, inputs = QKNorm(GemmaNorm(), VIEWS[view]), (_x(),)
    rewritten = rewrite(module, inputs, "capture")
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    target, args = CAPTURED[view]
    node = assert_keeps_the_layout(rewritten, inputs, target)
    assert cast_path(norm_input(node)) == ("x", ())
    # the model's own view, with its own arguments, of the rebuilt output; nothing of the old view is left
    assert _permute_after(node).args[1:] == args
    assert len([n for n in rewritten.graph_module.graph.nodes if n.target == target]) == 1
    assert_matches_eager(module, inputs, rewritten, ONE_ROUNDING_MORE)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rule_the_qnn_profile_rebuilds_a_transposed_norm_in_quantization_capture(dtype):
    # A Llama norm in D with a weight in D: QNN takes D in capture; it reads x before the transpose.
    module, inputs = QKNorm(LlamaNorm()).to(dtype), (_x(dtype),)
    rewritten = rewrite(module, inputs, "capture", backend="qnn", quantization_capture=True)
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    node = assert_keeps_the_layout(rewritten, inputs, torch.ops.aten.transpose.int)
    assert cast_path(norm_input(node)) == ("x", ()) and node.args[2].op == "get_attr"
    assert_matches_eager(module, inputs, rewritten)


class WidenedView(nn.Module):
    """A float32 norm of the float32 upcast of a half model's transposed view (as QNN's one dtype rebuilds a
    half Gemma norm, whose ``1 + w`` is float32), with a float32 weight."""

    def __init__(self):
        super().__init__()
        self.weight = LlamaNorm().weight

    def forward(self, x):
        h = x.transpose(1, 2).float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS))


@pytest.mark.parametrize("backend", ["aten", "qnn"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_rule_a_norm_on_a_widened_view_stays_and_says_why(dtype, backend):
    """Rebuilt before the transpose, the norm would need a new float32 cast of x, which rule 9 does not make."""
    module, inputs = WidenedView(), (_x(dtype),)
    rewritten = rewrite(module, inputs, "capture", backend=backend, quantization_capture=True)
    assert_left(rewritten, "dim order", "is a float32 copy of the permuted view transpose")


def test_rule_a_dynamic_sequence_length_keeps_the_symbolic_layout():
    """Strides that depend on the sequence length are compared as expressions, and the program is run at
    other lengths than the one it was exported with."""
    module = QKNorm(GemmaNorm())
    seq = Dim("seq", min=2, max=1024)
    rewritten = rewrite(module, (_x(),), "capture", dynamic_shapes=({1: seq},))
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ())
    model = exported(QKNorm(GemmaNorm()), (_x(),), "capture", dynamic_shapes=({1: seq},))
    [model_output] = [n for n in model.graph.nodes if n.op == "output"][0].args[0]
    strides = _permute_after(node).meta["val"].stride()
    assert any(isinstance(s, torch.SymInt) for s in strides)
    assert str(strides) == str(model_output.meta["val"].stride())  # (64*s, 16, 64, 1) in both
    for length in (3, 77, 512):
        inputs = (_x(shape=(2, length, 4, 16), seed=length),)
        assert_keeps_the_layout(rewritten, inputs, torch.ops.aten.transpose.int)
        assert_matches_eager(module, inputs, rewritten, ONE_ROUNDING_MORE)


@pytest.mark.parametrize("mode", ("edge",))
def test_edge_graphs_copy_the_transpose_and_are_rebuilt_as_before(mode):
    """An edge graph's permute_copy makes a contiguous tensor, and the norm is rebuilt on it with nothing
    after it: rule 9 changes nothing there."""
    module, inputs = QKNorm(GemmaNorm()), (_x(),)
    rewritten = rewrite(module, inputs, mode)
    [decision] = rewritten.result.decisions
    assert decision.rebuilt and decision.note is None, decision
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert "permute_copy" in str(node.args[0].target)
    assert not any("permute" in str(u.target) for u in node.users)
    assert_matches_eager(module, inputs, rewritten, ONE_ROUNDING_MORE)


# Near misses and neighbours.


class TransposedLastDim(nn.Module):
    """A norm over the last dim of ``x.transpose(-1, -2)``: it normalizes x's second-to-last dim."""

    def __init__(self, view):
        super().__init__()
        self.norm, self.view = LlamaNorm(16), view

    def forward(self, x):
        return self.norm(self.view(x))


@pytest.mark.parametrize("view, reason, shape", [
    (lambda x: x.transpose(-1, -2), "transpose puts dim 2 of x at dim 3, which the norm normalizes", (2, 8, 16, 5)),
    (lambda x: x.permute(0, 2, 3, 1), "permute puts dim 1 of x at dim 3, which the norm normalizes", (2, 16, 8, 5)),
    # Square in its last two dims: a norm rebuilt on x would have x's shape and pass the strides check,
    # and normalize the wrong dim; only the permutation check leaves it.
    (lambda x: x.transpose(-1, -2), "transpose puts dim 2 of x at dim 3, which the norm normalizes", (2, 4, 16, 16)),
], ids=["transpose(-1, -2)", "permute(0, 2, 3, 1)", "transpose(-1, -2) of a square"])
def test_rule_a_permutation_that_moves_the_normalized_dim_stays(view, reason, shape):
    module, inputs = TransposedLastDim(view), (_x(shape=shape),)
    assert_left(rewrite(module, inputs, "capture"), "dim order", reason)


class SliceBetween(nn.Module):
    """The first 3 of 4 heads of the transposed view, then the norm: a slice sits between the two."""

    def __init__(self):
        super().__init__()
        self.norm = GemmaNorm()

    def forward(self, x):
        return self.norm(x.transpose(1, 2)[:, :3])


class RoundingCastBetween(nn.Module):
    """A float32 tensor transposed, rounded to float16, then a float16 norm."""

    def __init__(self):
        super().__init__()
        self.norm = LlamaNorm().to(torch.float16)

    def forward(self, x):
        return self.norm(x.transpose(1, 2).to(torch.float16))


@pytest.mark.parametrize("module", [SliceBetween, RoundingCastBetween], ids=["a slice", "a rounding cast"])
def test_rule_anything_but_a_cast_that_changes_nothing_between_the_view_and_the_norm_stays(module):
    assert_left(rewrite(module(), (_x(),), "capture"), "dim order", "is no transpose or permute of a tensor")


class TwoTransposes(nn.Module):
    """A norm over ``x.transpose(1, 2).transpose(0, 1)``: rebuilt before the last transpose, the norm would
    read a transposed tensor, and rms_norm's output would not have the model's strides."""

    def __init__(self):
        super().__init__()
        self.norm = LlamaNorm()

    def forward(self, x):
        return self.norm(x.transpose(1, 2).transpose(0, 1))


def test_rule_a_permuted_output_whose_strides_differ_from_the_models_stays():
    assert_left(rewrite(TwoTransposes(), (_x(shape=(2, 3, 5, 16)),), "capture"), "dim order", "it would have shape")


class WrittenInside(nn.Module):
    """The transposed tensor is written in place after its square is averaged and before it is scaled: the
    model scales the written values by the norm of the unwritten ones."""

    def __init__(self):
        super().__init__()
        self.weight = LlamaNorm().weight

    def forward(self, x):
        t = x.clone()
        h = t.transpose(1, 2)
        variance = h.pow(2).mean(-1, keepdim=True)
        t.mul_(2.0)
        return self.weight * (h * torch.rsqrt(variance + EPS))


def test_rule_an_in_place_write_inside_a_transposed_norm_stays():
    assert_left(rewrite(WrittenInside(), (_x(),), "capture"), "the in-place op", "runs inside the norm")


class WrittenBefore(nn.Module):
    """The tensor is written in place after the transpose is taken and before the norm reads it."""

    def __init__(self):
        super().__init__()
        self.norm = GemmaNorm()

    def forward(self, x):
        t = x.clone()
        h = t.transpose(1, 2)
        t.mul_(2.0)
        return self.norm(h)


def test_rule_a_write_before_a_transposed_norm_is_read_as_the_view_reads_it():
    module, inputs = WrittenBefore(), (_x(),)
    rewritten = rewrite(module, inputs, "capture")
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert node.args[0].name == "clone"  # the written tensor, read where the norm ends
    assert_keeps_the_layout(rewritten, inputs, torch.ops.aten.transpose.int)
    assert_matches_eager(module, inputs, rewritten, ONE_ROUNDING_MORE)


class TransposedAlsoUsed(nn.Module):
    """The transposed view has another reader: it is kept for that reader."""

    def __init__(self):
        super().__init__()
        self.norm = GemmaNorm()

    def forward(self, x):
        h = x.transpose(1, 2)
        return self.norm(h), h * 2.0


def test_rule_a_transposed_view_with_another_reader_is_kept_for_it():
    module, inputs = TransposedAlsoUsed(), (_x(),)
    rewritten = rewrite(module, inputs, "capture")
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ())
    transposes = [n for n in rewritten.graph_module.graph.nodes if n.target == torch.ops.aten.transpose.int]
    assert len(transposes) == 2 and _permute_after(node) in transposes  # the model's, and the rebuilt norm's
    expected, actual = module(*inputs), rewritten.run(*inputs)
    for e, a in zip(expected, actual):
        assert e.stride() == a.stride()
    assert compare(expected[1], actual[1], ulps=0).ok
    assert_matches_eager(lambda x: module(x)[0], inputs, _First(rewritten), ONE_ROUNDING_MORE)


class _First:
    """The first output of a rewritten program, for comparisons of one tensor."""

    def __init__(self, rewritten):
        self.rewritten = rewritten

    def run(self, *inputs):
        return self.rewritten.run(*inputs)[0]


def test_rule_a_permuted_view_of_a_tensor_without_metadata_stays_and_says_why():
    module, inputs = QKNorm(GemmaNorm()), (_x(),)
    graph = exported(module, inputs, "capture")
    [x] = [n for n in graph.graph.nodes if n.op == "placeholder"]
    del x.meta["val"]
    [decision] = edgefuse.recompose_rms_norm(graph).decisions
    assert not decision.rebuilt and "could not read the permutation transpose applies" in decision.reason
    assert compare(module(*inputs), graph(*inputs), ulps=0).ok


def test_rule_an_error_while_reading_a_permuted_input_leaves_the_norm_and_says_so(monkeypatch):
    """Rule 9 runs before the graph changes: whatever it raises leaves the norm decomposed, as every read does."""

    def broken(match, table):
        raise RuntimeError("metadata edgefuse cannot read")

    monkeypatch.setattr(edgefuse.core.recompose, "permuted_input", broken)
    module, inputs = QKNorm(GemmaNorm()), (_x(),)
    graph = exported(module, inputs, "capture")
    [decision] = edgefuse.recompose_rms_norm(graph).decisions
    assert not decision.rebuilt and UNREADABLE in decision.reason and "metadata edgefuse cannot read" in decision.reason
    assert compare(module(*inputs), graph(*inputs), ulps=0).ok
