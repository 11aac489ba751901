"""Fixed malformed graphs: inputs no exporter makes, each of which must get decisions with reasons.

The generated cases' damaged variants are in :mod:`edgefuse.fuzz.hostile`; these are the graphs that
cannot be generated from a norm module: an empty graph, a mean without arguments or metadata, a
symbolically traced graph, an eps that is NaN or infinite, a weight whose shape is not the normalized
shape, a symbolic normalized width. :func:`run_malformed` feeds each to the pass under every backend
profile; a failure is an exception (but the clear refusal an input must get), a norm left without a
reason, or a norm rebuilt that must not be.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn
from torch.export import Dim, export
from torch.fx import Graph, GraphModule

import edgefuse

BACKENDS = (("aten", False), ("qnn", False), ("qnn", True))


@dataclass(frozen=True)
class Malformed:
    """One malformed input: how to make it, whether a norm may be rebuilt in it, and with a weight;
    ``refusal`` is part of the message of the ValueError the pass must refuse it with, if it must."""

    name: str
    make: Callable[[], object]
    rebuild_allowed: bool = False
    weight_allowed: bool = True
    refusal: str | None = None


class _Norm(nn.Module):
    """A float32 norm whose eps, weight shape and input are chosen by the caller."""

    def __init__(self, eps: float = 1e-6, weight_shape: tuple[int, ...] | None = (16,)):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 16).reshape(weight_shape)) if weight_shape else None

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return h * self.weight if self.weight is not None else h


def _exported(module: nn.Module, dynamic: dict | None = None) -> GraphModule:
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0))
    return export(module, (x,), dynamic_shapes=(dynamic,) if dynamic else None).module()


def _graph(build: Callable[[Graph], object]) -> Callable[[], GraphModule]:
    def make() -> GraphModule:
        graph = Graph()
        graph.output(build(graph))
        return GraphModule(nn.Module(), graph)

    return make


def _lying_weight() -> GraphModule:
    gm = _exported(_Norm())
    for node in gm.graph.nodes:
        if node.op == "get_attr" and "weight" in node.target:
            node.meta["val"] = node.meta["val"].new_empty((17,))
    return gm


def malformed_graphs() -> Iterator[Malformed]:
    """Every fixed malformed input."""
    yield Malformed("empty graph (no nodes at all)", lambda: GraphModule(nn.Module(), Graph()))
    yield Malformed("placeholders and output only, no metadata", _graph(lambda g: g.placeholder("x")))
    yield Malformed(
        "a mean without metadata",
        _graph(lambda g: g.call_function(torch.ops.aten.mean.dim, (g.placeholder("x"), [-1], True))),
    )
    yield Malformed("a mean of a Python number", _graph(lambda g: g.call_function(torch.ops.aten.mean.dim, (3.0, [-1], True))))
    yield Malformed("a mean without arguments", _graph(lambda g: g.call_function(torch.ops.aten.mean.dim, ())))
    yield Malformed(
        "a symbolically traced graph (call_method nodes, torch functions, no metadata)",
        lambda: torch.fx.symbolic_trace(_Norm(weight_shape=None)),
        refusal="export the model with torch.export",
    )
    for eps in (float("nan"), float("inf"), float("-inf"), -1e-6):
        yield Malformed(f"eps is {eps}", lambda eps=eps: _exported(_Norm(eps=eps)))
    yield Malformed("the weight's metadata says (17,), the norm is over (16,)", _lying_weight, rebuild_allowed=True)
    # (1, 16) broadcasts like the weight but is not the normalized shape: never the weight
    yield Malformed(
        "a weight of shape (1, 16)", lambda: _exported(_Norm(weight_shape=(1, 16))), rebuild_allowed=True, weight_allowed=False
    )
    yield Malformed("a symbolic normalized width", lambda: _exported(_Norm(weight_shape=None), {2: Dim("width", min=2, max=64)}))


def check_malformed(item: Malformed, backend: str, capture: bool) -> str | None:
    """Why the pass fails ``item`` under one profile, or None when it gives every norm a decision and a reason."""
    try:
        result = edgefuse.recompose_rms_norm(item.make(), backend=backend, quantization_capture=capture)
    except ValueError as error:
        if item.refusal is not None and item.refusal in str(error):
            return None
        return "recompose_rms_norm raised:\n" + traceback.format_exc(limit=-6)
    except Exception:  # noqa: BLE001
        return "recompose_rms_norm raised:\n" + traceback.format_exc(limit=-6)
    if item.refusal is not None:
        return f"expected a ValueError saying {item.refusal!r}, got {len(result.decisions)} decisions"
    for decision in result.decisions:
        if decision.rebuilt and not item.rebuild_allowed:
            return f"a norm was rebuilt: {decision}"
        if decision.rebuilt and decision.weight is not None and not item.weight_allowed:
            return f"a tensor that is not of the normalized shape was taken as the weight: {decision}"
        if not decision.rebuilt and not (isinstance(decision.reason, str) and decision.reason.strip()):
            return f"a norm was left without a reason: {decision}"
    return None


def run_malformed() -> tuple[int, list[str]]:
    """(inputs checked, failures as text) over every malformed input and backend profile."""
    checked, failures = 0, []
    for item in malformed_graphs():
        for backend, capture in BACKENDS:
            checked += 1
            why = check_malformed(item, backend, capture)
            if why is not None:
                failures.append(f"{item.name} ({backend}{'+quantization-capture' if capture else ''}): {why}")
    return checked, failures
