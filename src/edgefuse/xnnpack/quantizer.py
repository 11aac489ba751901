"""Quantized XNNPACK flows: static qs8 (PT2E) and 8-bit dynamic activations with 4-bit weights (8da4w).

- **qs8**: the pinned ``XNNPACKQuantizer`` with ``get_symmetric_quantization_config(is_per_channel=True)``
  annotates linears, convolutions, ``add``, ``mul`` and ``cat``; a norm's ``add`` (eps) and ``mul``
  become int8 while its ``pow``, ``mean`` and ``rsqrt`` stay float. Its ``transform_for_annotation``
  turns every scalar operand of ``add``/``mul`` into a float tensor, integer index arithmetic included
  (Hugging Face mask building: ``arange(n) + offset``), and calibration then fails in ``aten.index``
  ("tensors used as indices must be long..."); :func:`qs8_quantizer` lifts only the scalars of float ops.
- **8da4w**: ExecuTorch's LLM-export source transform (``extension.llm.export.quantize.quantize_model_``
  with ``qlinear_config="8da4w"``: torchao's ``Int8DynamicActivationIntxWeightConfig``, int4 weights
  in groups, int8 activations quantized per token at run time) on every linear; norms stay float.

Both programs then lower with stock ``XnnpackPartitioner`` or :func:`edgefuse.xnnpack.lower`. A norm's
``mean`` reads ``pow``'s float output in both schemes, so edgefuse delegates it. A ``mean`` that reads a
dequantized 4-D tensor in a graph with a convolution or pooling keeps the stock path (the layout pass
may make it channels-last), and stock lowers it only as 4-D global average pooling; every other such
mean runs on the portable kernel. Other means of dequantized tensors are delegated behind the
delegate's own dequantize.
:func:`mean_placements` says where each mean went and why.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from edgefuse.core._fx import module_path, top_graph
from edgefuse.core.ops import CAPTURE, EDGE, Role
from edgefuse.quant.facts import NormQuantization, mark_norms, norm_quantization
from edgefuse.xnnpack.lowering import EDGEFUSE, STOCK, lower_with as lower  # noqa: F401  (the quantized programs lower the same two ways)

SCHEMES = ("qs8", "8da4w")


def _lift_float_scalars(model: GraphModule) -> GraphModule:
    """The released scalar lifting (each scalar operand of ``add``/``mul`` becomes a float tensor constant,
    so it gets an observer), undone on the ops that do not compute a float tensor: index arithmetic
    must keep its integer scalars."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import _convert_scalars_to_attrs

    kept = {}
    for node in model.graph.nodes:
        if CAPTURE.is_a(node, Role.ADD, Role.MUL):
            value = node.meta.get("val")
            if not (isinstance(value, torch.Tensor) and value.dtype.is_floating_point):
                kept[node] = node.args
    model = _convert_scalars_to_attrs(model)
    for node, args in kept.items():
        lifted = [a for a in node.args if isinstance(a, Node) and a not in args]
        node.args = args
        for attr in lifted:
            if not attr.users:
                model.graph.erase_node(attr)
                delattr(model, attr.target)
    if kept:
        model.recompile()
    return model


def qs8_quantizer():
    """The pinned ``XNNPACKQuantizer`` set for static qs8 with per-channel weights, lifting float scalars only."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    class FloatScalarsXnnpackQuantizer(XNNPACKQuantizer):
        """``XNNPACKQuantizer`` that leaves integer ``add``/``mul`` scalars alone.

        It also skips the convolution-batch-norm patterns on a graph without a batch norm: they cannot
        match there, and tracing them costs seconds on every ``prepare_pt2e``.
        """

        def transform_for_annotation(self, model: GraphModule) -> GraphModule:
            return _lift_float_scalars(model)

        def annotate(self, model: GraphModule) -> GraphModule:
            if not any(n.op == "call_function" and "batch_norm" in str(n.target) for n in model.graph.nodes):
                self.SUPPORTED_PATTERNS = [p for p in type(self).SUPPORTED_PATTERNS if "_bn" not in p.name]
            return super().annotate(model)

    return FloatScalarsXnnpackQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


@dataclass
class Quantized:
    """A quantized module ready to export, and (for qs8) how each norm was quantized."""

    scheme: str
    module: torch.nn.Module
    norms: list[NormQuantization]


def quantize_qs8(
    module: torch.nn.Module, example_inputs: Sequence[Any], calibration: Iterable[Sequence[Any]]
) -> Quantized:
    """Capture, annotate with :func:`qs8_quantizer`, calibrate on ``calibration`` and convert."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with torch.no_grad():
        gm = torch.export.export(module, tuple(example_inputs)).module()
    mark_norms(gm)
    prepared = prepare_pt2e(gm, qs8_quantizer())
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    converted = convert_pt2e(prepared)
    return Quantized("qs8", converted, norm_quantization(converted))


def quantize_8da4w(module: torch.nn.Module, group_size: int = 32) -> Quantized:
    """A copy of ``module`` with every linear in 8da4w, as ExecuTorch's LLM export quantizes them."""
    import contextlib
    import io
    import warnings

    from executorch.extension.llm.export.quantize import quantize_model_

    quantized = copy.deepcopy(module)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # quantize_model_ is marked experimental, and prints what it does
        quantize_model_(quantized, qlinear_config="8da4w", qlinear_group_size=group_size)
    return Quantized("8da4w", quantized, [])


def quantize(scheme: str, module: torch.nn.Module, example_inputs: Sequence[Any], calibration=()) -> Quantized:
    """``scheme`` is ``"qs8"`` or ``"8da4w"``."""
    if scheme == "qs8":
        return quantize_qs8(module, example_inputs, calibration)
    if scheme == "8da4w":
        return quantize_8da4w(module)
    raise ValueError(f"unknown scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")


def export_quantized(quantized: Quantized, example_inputs: Sequence[Any]) -> ExportedProgram:
    """``torch.export`` of the quantized module, under ``no_grad``."""
    with torch.no_grad():
        return torch.export.export(quantized.module, tuple(example_inputs))


@dataclass(frozen=True)
class MeanPlacement:
    """Where one ``mean`` of an edge program went: into a delegate, or left outside and why."""

    name: str
    module_path: str | None
    reads: str
    delegated: bool
    reason: str | None


def _reads(node: Node) -> str:
    source = node.args[0]
    if isinstance(source, Node) and EDGE.is_a(source, Role.DEQUANTIZE):
        return "dequantized"
    return "float"


def mean_placements(program: ExportedProgram, lowered) -> list[MeanPlacement]:
    """Each ``mean.dim`` of ``program``'s edge graph, and whether ``lowered`` (edgefuse's) delegated it.

    A mean edgefuse does not substitute keeps the stock path, which delegates only global average
    pooling; the reason says why it was not substituted. A substituted mean is delegated unless a
    config or the single-row policy refused it; the refused ones are told apart by the module they
    belong to (the mean restored after partitioning keeps its metadata).
    """
    from executorch.exir import to_edge

    from edgefuse.xnnpack.substitute import is_stock_global_avg_pool, mean_reason

    edge = top_graph(to_edge(program))
    top = top_graph(lowered)
    outside = [module_path(n) for n in top.graph.nodes if EDGE.is_a(n, Role.MEAN)]
    placements = []
    for node in (n for n in edge.graph.nodes if EDGE.is_a(n, Role.MEAN)):
        reason, path = mean_reason(node), module_path(node)
        if reason is not None:
            delegated = is_stock_global_avg_pool(node)
            if not delegated:
                reason = f"{reason}; stock delegates only a 4-D mean over dims [2, 3] with keepdim"
        else:
            delegated = True
        if not delegated and path in outside:
            outside.remove(path)
        placements.append(MeanPlacement(node.name, path, _reads(node), delegated, reason))
    for i, p in enumerate(placements):
        if p.delegated and p.reason is None and p.module_path in outside:
            outside.remove(p.module_path)
            placements[i] = MeanPlacement(p.name, p.module_path, p.reads, False,
                                          "refused by edgefuse's mean config or its single-row policy")
    return placements
