"""Each norm's own error inside a converted (quantized) program, apart from the error it inherits.

A model's output error sums every rounding upstream, so two programs that quantize one norm
differently can differ at the output by more than that norm's own error, either way. This runs the
converted program, records what each tagged norm read (its dequantized input), what it computed before
its output was quantized, and what its readers got back, and compares the last with the float norm
module applied to the same input: the norm's own error, comparable between a rebuilt and a decomposed
norm. It also says whether the worst element was clipped: the quantized program's input to the norm
can leave the range calibration saw (calibration runs the float model), and then the output quantize
clips the result, whatever the norm's form.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.fx import GraphModule, Interpreter, Node

from edgefuse.quant.facts import NORM_KEY, dequantized, is_quantize, readers


@dataclass(frozen=True)
class NormError:
    """One norm's own error over every run.

    ``max_error`` is against the norm module in the model's dtype, ``exact_error`` against the same
    module in float64 (the exact norm of the same input); ``output_max`` is the output's largest
    magnitude; ``clipped`` says whether the element with the largest ``exact_error`` lies outside its
    output quantization's range, and ``unclipped_error`` is the largest ``exact_error`` over the
    elements that do not.
    """

    key: str
    max_error: float
    exact_error: float
    output_max: float
    clipped: bool = False
    unclipped_error: float = 0.0


@dataclass(frozen=True)
class _Ends:
    entering: Node
    computed: Node
    leaving: Node
    quantize: Node | None


def _ends(graph_module: GraphModule) -> dict[str, _Ends]:
    """Per norm key: the value its first op reads, its output before quantization, and what readers get."""
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
        if quantize is not None:
            reader = readers(quantize)[0]
            leaving = next(a for a in reader.all_input_nodes if dequantized(a) is not None and dequantized(a).args[0] is quantize)
        ends[key] = _Ends(entering, computed, leaving, quantize)
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


def _outside_range(value: torch.Tensor, quantize: Node | None) -> torch.Tensor:
    """Which elements of ``value`` lie beyond the range ``quantize`` represents, by more than half a step."""
    if quantize is None or len(quantize.args) < 5:
        return torch.zeros_like(value, dtype=torch.bool)
    scale, zero, low, high = (float(a) for a in quantize.args[1:5])
    lowest, highest = (low - zero) * scale, (high - zero) * scale
    return (value < lowest - scale / 2) | (value > highest + scale / 2)


def norm_errors(
    converted: GraphModule,
    norm_module: Callable[[str], torch.nn.Module],
    inputs: Sequence[Sequence[Any]],
) -> list[NormError]:
    """The own error of every tagged norm of ``converted`` over ``inputs``.

    ``norm_module(key)`` returns the float module that computes the norm with that key (for the tiny
    models, ``model.get_submodule(key)``).
    """
    ends = _ends(converted)
    wanted = {n for e in ends.values() for n in (e.entering, e.computed, e.leaving)}
    exact = {key: copy.deepcopy(norm_module(key)).double() for key in ends}
    worst: dict[str, list] = {key: [0.0, 0.0, 0.0, False, 0.0] for key in ends}
    with torch.no_grad():
        for args in inputs:
            recorder = _Recorder(converted, wanted)
            recorder.run(*args)
            for key, e in ends.items():
                x = recorder.values[e.entering]
                y = recorder.values[e.leaving].double()
                expected = norm_module(key)(x).double()
                error = (y - exact[key](x.double()).double()).abs()
                clipped = _outside_range(recorder.values[e.computed].double(), e.quantize)
                w = worst[key]
                w[0] = max(w[0], float((y - expected).abs().max()))
                if float(error.max()) > w[1]:
                    w[1] = float(error.max())
                    w[3] = bool(clipped.flatten()[int(error.argmax())])
                w[2] = max(w[2], float(expected.abs().max()))
                w[4] = max(w[4], float(torch.where(clipped, 0.0, error).max()))
    return [NormError(key, *values) for key, values in worst.items()]
