"""Captured graphs keep in-place ops: no rewrite moves a read past one, folds written state, or drops a copy."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import export

import edgefuse
from edgefuse.core.verify import compare
from tests.harness import cast_path, norm_input, rms_norm_nodes


def _x(shape=(2, 5, 16), seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).mul(3).to(dtype)


def _weight():
    return nn.Parameter(torch.linspace(0.5, 2.0, 16))


class WriteInsideNorm(nn.Module):
    """The normalized tensor's source is written in place between the normalization and the weight."""

    def __init__(self):
        super().__init__()
        self.weight = _weight()

    def forward(self, x):
        h = x * 1.0
        n = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        h.add_(1.0)
        return n * self.weight + h


class WriteAfterUpcast(nn.Module):
    """A float16 input written after its float32 copy was taken: the norm reads the copy, not the input."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 2.0, 16).half())

    def forward(self, x):
        y = x * 1.0
        h = y.float()
        y.add_(1.0)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(y.dtype) + y


class WriteBeforeNorm(nn.Module):
    """An in-place op before the norm reads anything: the norm is rebuilt."""

    def __init__(self):
        super().__init__()
        self.weight = _weight()

    def forward(self, x):
        h = x * 1.0
        h.mul_(2.0)
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


def _capture(module, inputs, given="graph", **options):
    """Recompose the captured graph, or the exported program (whose placeholders are its buffers)."""
    program = export(module, inputs)
    if given == "program":
        result = edgefuse.recompose_rms_norm(program, **options)
        return program.module(), result
    graph = program.module()
    return graph, edgefuse.recompose_rms_norm(graph, **options)


def test_a_norm_with_an_in_place_op_inside_stays():
    module, inputs = WriteInsideNorm(), (_x(),)
    graph, result = _capture(module, inputs)
    assert rms_norm_nodes(graph) == []
    assert "in-place op add_" in result.decisions[0].reason
    assert compare(module(*inputs), graph(*inputs), ulps=0).ok


def test_a_norm_whose_input_is_written_after_its_upcast_stays():
    module, inputs = WriteAfterUpcast(), (_x(dtype=torch.float16),)
    graph, result = _capture(module, inputs)
    assert rms_norm_nodes(graph) == []
    assert all("in-place op" in d.reason for d in result.decisions), result.decisions
    assert compare(module(*inputs), graph(*inputs), ulps=0).ok


def test_an_in_place_op_before_the_norm_does_not_stop_it():
    module, inputs = WriteBeforeNorm(), (_x(),)
    graph, result = _capture(module, inputs)
    [node] = rms_norm_nodes(graph)
    assert cast_path(norm_input(node)) == ("mul_", ())  # the written tensor, read after the write as the model does
    assert compare(module(*inputs), graph(*inputs)).ok


class WrittenEps(nn.Module):
    """eps is a buffer the model adds to on every call, directly or through a view of it."""

    def __init__(self, through_a_view: bool = False):
        super().__init__()
        self.through_a_view = through_a_view
        self.register_buffer("eps", torch.tensor(1.0))

    def forward(self, x):
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        (self.eps.view(1) if self.through_a_view else self.eps).add_(1.0)
        return out


@pytest.mark.parametrize("given", ["graph", "program"])
@pytest.mark.parametrize("through_a_view", [False, True], ids=["directly", "through-a-view"])
def test_a_buffer_written_in_place_is_not_a_constant_eps(through_a_view, given):
    graph, result = _capture(WrittenEps(through_a_view), (_x(),), given)
    assert rms_norm_nodes(graph) == [] and "eps" in result.decisions[0].reason
    reference = WrittenEps(through_a_view)
    for _ in range(3):  # eps grows on every call, in both
        assert compare(reference(_x()), graph(_x()), ulps=0).ok


class WrittenGemmaWeight(nn.Module):
    """Gemma's ``1 + w`` with ``w`` a buffer the model halves on every call, whole or one piece of it."""

    def __init__(self, piece: str = "whole"):
        super().__init__()
        self.piece = piece
        self.register_buffer("w", torch.linspace(-0.5, 0.5, 16))

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + self.w)
        written = {
            "whole": lambda: self.w,
            "chunk": lambda: self.w.chunk(2)[0],  # a getitem of a list of views
            "split": lambda: self.w.split(8)[1],
            "unbind": lambda: self.w.view(2, 8).unbind(0)[0],
        }[self.piece]()
        written.mul_(0.5)
        return y


@pytest.mark.parametrize("piece", ["whole", "chunk", "split", "unbind"])
@pytest.mark.parametrize("given", ["graph", "program"])
def test_qnn_never_folds_a_weight_the_model_writes(given, piece):
    graph, result = _capture(WrittenGemmaWeight(piece), (_x(),), given, backend="qnn")
    assert rms_norm_nodes(graph) == [] and "constant weight" in result.decisions[0].reason
    reference = WrittenGemmaWeight(piece)
    for _ in range(3):
        assert compare(reference(_x()), graph(_x()), ulps=0).ok


class CopyThenWrite(nn.Module):
    """``to(copy=True)`` snapshots a buffer that is then written: the copy is what the model returns."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(4))

    def forward(self, x):
        snapshot = self.state.to(torch.float32, copy=True)
        self.state.add_(x)
        return snapshot * 2, x.to(torch.float32) + 1


def test_cast_removal_keeps_a_copy_in_a_graph_with_in_place_ops():
    graph = export(CopyThenWrite(), (torch.ones(4),)).module()
    removed = edgefuse.remove_redundant_casts(graph)
    assert removed == ["to_1"]  # the aliasing no-op cast goes; the copy stays
    reference = CopyThenWrite()
    for _ in range(2):
        for expected, actual in zip(reference(torch.ones(4)), graph(torch.ones(4))):
            assert torch.equal(expected, actual)
