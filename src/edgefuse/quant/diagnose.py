"""Each norm's own error inside a converted (quantized) program, apart from the error it inherits.

A model's output error sums every rounding upstream, so two programs that quantize one norm
differently can differ at the output by more than that norm's own error, either way. This runs the
converted program, records what each tagged norm read (its dequantized input) and what its readers got
back, and compares the latter with the exact norm of the same input (the float norm module run in
float64 throughout, :mod:`edgefuse.quant.exact`), clamped to the range its output quantization
represents: no quantized norm can hand on a value outside that range, so the clamped exact norm is the
best any form of the norm could give, and the distance to it is the norm's own error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.fx import GraphModule, Interpreter, Node

from edgefuse.quant.exact import exact_module
from edgefuse.quant.facts import NORM_KEY, dequantized, is_quantize, readers


@dataclass(frozen=True)
class NormError:
    """One norm's own error over every run: the largest distance of what its readers got from the
    exact norm of its input, clamped to its output quantization's range (``inf`` where anything was
    NaN), and the largest magnitude of the exact norm."""

    key: str
    exact_error: float
    output_max: float


@dataclass(frozen=True)
class NormEnds:
    """Where one norm of a converted graph begins and ends: ``entering`` (the dequantized value its
    first op reads), ``computed`` (its output before quantization), ``quantize`` (what quantizes that, if
    anything), ``leaving`` (the value its readers get) and ``reader`` (the first of them). ``source``
    and ``reader`` are the model's own nodes, so two flows of one model can be checked to give a norm
    the same window."""

    entering: Node
    computed: Node
    leaving: Node
    quantize: Node | None

    reader: Node

    @property
    def source(self) -> Node:
        """The model's node whose quantized output the norm reads."""
        return dequantized(self.entering).args[0].args[0]


def norm_ends(graph_module: GraphModule) -> dict[str, NormEnds]:
    """Per norm key (:func:`~edgefuse.quant.facts.mark_norms`): where the norm begins and ends; norms
    read from no quantized value, or with no output, are left out."""
    members: dict[str, list[Node]] = {}
    for node in graph_module.graph.nodes:
        key = node.meta.get(NORM_KEY)
        if key is not None and node.op == "call_function" and not (is_quantize(node) or dequantized(node) is not None):
            members.setdefault(key, []).append(node)
    ends = {}
    for key, nodes in members.items():
        inside = set(nodes)
        entering = None
        for node in nodes:
            for arg in node.all_input_nodes:
                dq = dequantized(arg)
                if entering is None and dq is not None and is_quantize(dq.args[0]):
                    origin = dq.args[0].args[0]
                    if origin not in inside and origin.op != "get_attr":
                        entering = arg
        outputs = [n for n in nodes if any(
            u not in inside and not (is_quantize(u) and all(r in inside for r in readers(u))) for u in n.users
        )]
        if entering is None or not outputs:
            continue
        computed = outputs[-1]
        quantize = next((u for u in computed.users if is_quantize(u) and readers(u)), None)
        leaving = computed
        reader = next((u for u in computed.users if u not in inside), None)
        if quantize is not None:
            reader = readers(quantize)[0]
            leaving = next(a for a in reader.all_input_nodes if dequantized(a) is not None and dequantized(a).args[0] is quantize)
        ends[key] = NormEnds(entering, computed, leaving, quantize, reader)
    return ends


class _Recorder(Interpreter):
    def __init__(self, gm: GraphModule, wanted: set[Node]):
        super().__init__(gm)
        self.wanted = wanted
        self.values: dict[Node, torch.Tensor] = {}

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if n in self.wanted:
            self.values[n] = result
        return result


def _representable(value: torch.Tensor, quantize: Node | None) -> torch.Tensor:
    """``value`` clamped to the range ``quantize`` represents (unchanged when nothing quantizes it)."""
    if quantize is None or len(quantize.args) < 5:
        return value
    scale, zero, low, high = (float(a) for a in quantize.args[1:5])
    return value.clamp((low - zero) * scale, (high - zero) * scale)


def _largest(values: torch.Tensor) -> float:
    """The largest element, ``inf`` if any is NaN (``max`` would pass a NaN over)."""
    return float("inf") if bool(values.isnan().any()) else float(values.max())


def norm_errors(
    converted: GraphModule,
    norm_module: Callable[[str], torch.nn.Module],
    inputs: Sequence[Sequence[Any]],
) -> list[NormError]:
    """The own error of every tagged norm of ``converted`` over ``inputs``.

    ``norm_module(key)`` returns the float module that computes the norm with that key (for the tiny
    models, ``model.get_submodule(key)``).
    """
    ends = norm_ends(converted)
    wanted = {n for e in ends.values() for n in (e.entering, e.leaving)}
    exact = {key: exact_module(norm_module(key)) for key in ends}
    worst = {key: [0.0, 0.0] for key in ends}
    with torch.no_grad():
        for args in inputs:
            recorder = _Recorder(converted, wanted)
            recorder.run(*args)
            for key, e in ends.items():
                expected = exact[key](recorder.values[e.entering]).double()
                got = recorder.values[e.leaving].double()
                w = worst[key]
                w[0] = max(w[0], _largest((got - _representable(expected, e.quantize)).abs()))
                w[1] = max(w[1], _largest(expected.abs()))
    return [NormError(key, *values) for key, values in worst.items()]
