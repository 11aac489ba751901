"""Each norm's own error inside a converted (quantized) program, apart from the error it inherits.

A model's output error sums every rounding upstream, so two programs that quantize one norm
differently can differ at the output by more than that norm's own error, either way. This runs the
converted program, records what each tagged norm read (its dequantized input) and what its readers got
back, and compares the latter with the exact norm of the same input (the float norm module run in
float64 throughout, :mod:`edgefuse.quant.exact`).

Two flows of one model are compared within the values both flows' last quantization of the norm can
represent (the intersection of the two calibrated ranges): what each hands on and the exact norm are
clamped to it. Beyond a range a quantized norm clips whatever its form, and a flow whose range happens
to be narrower or wider must neither gain nor lose by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.fx import GraphModule, Node

from edgefuse.core._fx import Recorder
from edgefuse.quant.exact import exact_module
from edgefuse.quant.facts import NORM_KEY, dequantized, is_model_cast, is_quantize, readers


@dataclass(frozen=True)
class NormEnds:
    """Where one norm of a converted graph begins and ends: ``entering`` (the dequantized value its
    first op reads), ``computed`` (its output before quantization), ``quantize`` (what quantizes that, if
    anything), ``leaving`` (the value its readers get), ``reader`` (the first of them) and ``last`` (the
    last quantize of the window, whose range bounds what the norm hands on). ``source`` and ``reader``
    are the model's own nodes, so two flows of one model can be checked to give a norm the same window."""

    entering: Node
    computed: Node
    leaving: Node
    quantize: Node | None
    reader: Node
    last: Node | None

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
            leaving = next(a for a in reader.all_input_nodes
                           if dequantized(a) is not None and dequantized(a).args[0] is quantize)
        last = quantize or _last_quantize_before(computed, inside)
        ends[key] = NormEnds(entering, computed, leaving, quantize, reader, last)
    return ends


def _last_quantize_before(computed: Node, inside: set[Node]) -> Node | None:
    """The quantize that ``computed`` reads back through casts alone (a model's ``type_as`` after a
    quantized norm), whose range then bounds what the norm hands on; None when there is none."""
    node = computed
    while is_model_cast(node) and node.args and isinstance(node.args[0], Node):
        source = node.args[0]
        dq = dequantized(source)
        if dq is not None and is_quantize(dq.args[0]) and dq.args[0].args[0] in inside:
            return dq.args[0]
        if source not in inside:
            return None
        node = source
    return None


def _range(quantize: Node | None) -> tuple[float, float]:
    """The values ``quantize`` represents, from its scale, zero point and integer range (all of them
    when nothing quantizes)."""
    if quantize is None or len(quantize.args) < 5:
        return -math.inf, math.inf
    scale, zero, low, high = (float(a) for a in quantize.args[1:5])
    return (low - zero) * scale, (high - zero) * scale


@dataclass(frozen=True)
class NormRun:
    """One norm on one input: what it read and what its readers got, the exact norm of what it read
    (float64), and the range its last quantization represents."""

    read: torch.Tensor
    got: torch.Tensor
    exact: torch.Tensor
    low: float
    high: float


def norm_runs(
    converted: GraphModule,
    norm_module: Callable[[str], torch.nn.Module],
    inputs: Sequence[Sequence[Any]],
) -> dict[str, list[NormRun]]:
    """Run ``converted`` on every input and record each tagged norm (:class:`NormRun`, one per input).

    ``norm_module(key)`` returns the float module that computes the norm with that key (for the tiny
    models, ``model.get_submodule(key)``).
    """
    ends = norm_ends(converted)
    wanted = {n.name for e in ends.values() for n in (e.entering, e.leaving)}
    exact = {key: exact_module(norm_module(key)) for key in ends}
    runs: dict[str, list[NormRun]] = {key: [] for key in ends}
    with torch.no_grad():
        for args in inputs:
            recorder = Recorder(converted, wanted)
            recorder.run(*args)
            for key, e in ends.items():
                read = recorder.values[e.entering.name]
                expected = exact[key](read).double()
                runs[key].append(NormRun(read, recorder.values[e.leaving.name].double(), expected, *_range(e.last)))
    return runs


@dataclass(frozen=True)
class OwnError:
    """One norm's own error in two flows: the largest distance of what its readers got from the exact
    norm of what it read, both clamped to the range both flows' outputs represent (``inf`` where one
    is NaN)."""

    key: str
    ours: float
    theirs: float


def _largest(values: torch.Tensor) -> float:
    """The largest element, ``inf`` if any is NaN (``max`` would pass a NaN over); 0 when empty."""
    if values.numel() == 0:
        return 0.0
    return math.inf if bool(values.isnan().any()) else float(values.max())


def own_errors(ours: dict[str, list[NormRun]], theirs: dict[str, list[NormRun]]) -> dict[str, OwnError]:
    """Each norm recorded in both flows, on the same inputs: its own error in each. Values are clamped
    to the intersection of the two ranges, so a flow gains nothing from clipping the other cannot do."""
    result = {}
    for key in ours.keys() & theirs.keys():
        worst = [0.0, 0.0]
        for a, b in zip(ours[key], theirs[key], strict=True):
            low, high = max(a.low, b.low), min(a.high, b.high)
            for i, run in enumerate((a, b)):
                worst[i] = max(worst[i], _largest((run.got.clamp(low, high) - run.exact.clamp(low, high)).abs()))
        result[key] = OwnError(key, *worst)
    return result


def beyond_range(converted: GraphModule, inputs: Sequence[Any]) -> dict[str, tuple[str, float]]:
    """How far outside its range each quantize op of ``converted`` that quantizes a computed value finds
    it on ``inputs``, in its levels (0 within range), by the quantize op's name, with the op whose output
    it quantizes.

    A value the calibration did not see is clipped there: the converted module, and a program that
    matches it, go on with the clipped value. The module's buffers (a KV cache it writes) are put back.
    """
    from torch.utils import _pytree as pytree

    from edgefuse.core.fresh import kept_state

    quantizes = [n for n in converted.graph.nodes
                 if is_quantize(n) and n.args and getattr(n.args[0], "op", None) == "call_function"]
    recorder = Recorder(converted, {q.args[0].name for q in quantizes}, keep=lambda value: value.detach().clone())
    with torch.no_grad(), kept_state(converted):
        recorder.run(*pytree.tree_leaves(tuple(inputs)))
    result = {}
    for quantize in quantizes:
        low, high = _range(quantize)
        value = recorder.values[quantize.args[0].name].double()
        beyond = max(low - float(value.min()), float(value.max()) - high, 0.0) / float(quantize.args[1])
        result[quantize.name] = (str(quantize.args[0].target), beyond)
    return result
