"""The op vocabulary: one table of targets per dialect, read by every pass.

A captured ATen graph (``torch.export``, before or during quantization) and an ExecuTorch edge graph spell
the same arithmetic with different targets, and edge graphs spell casts two ways (``_to_dim_order_copy``
by default, ``aten._to_copy`` with ``_skip_dim_order=True``). Passes ask an :class:`OpTable` what a node
is instead of keeping target lists of their own.

Quantized graphs add the quantize and dequantize ops of ``quantized_decomposed`` (per tensor, per
channel, per channel group, per token) and torchao's affine ones, in both dialects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the quantized_decomposed ops)
import torchao.quantization.quant_primitives  # noqa: F401  (registers torchao's affine ops)
from torch.fx import Graph, Node

from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.dialects.edge._ops import EdgeOpOverload

aten = torch.ops.aten
edge = exir_ops.edge


class Role(enum.Enum):
    """What an op does, as far as the passes care."""

    CAST = "cast"
    MEAN = "mean"
    MUL = "mul"
    DIV = "div"
    ADD = "add"
    POW = "pow"
    SQUARE = "square"
    RSQRT = "rsqrt"
    SQRT = "sqrt"
    RECIPROCAL = "reciprocal"
    RESHAPE = "reshape"
    PERMUTE = "permute"
    RMS_NORM = "rms_norm"
    GELU = "gelu"
    ASSERT_METADATA = "assert_metadata"
    QUANTIZE = "quantize"
    DEQUANTIZE = "dequantize"


@dataclass(frozen=True)
class OpTable:
    """Targets of one dialect, by role; ``rms_norm`` is the target a rebuilt norm gets, ``view`` the one
    that views its input in another shape when a backend needs that (a :class:`~edgefuse.core.profiles.ShapeLimit`)."""

    dialect: str
    roles: Mapping[Any, Role]
    rms_norm: Any
    view: Any

    def __post_init__(self) -> None:
        # By identity: an op's ``__hash__`` is Python code, and the passes ask for the role of every node,
        # many times. Ops compare by identity, and ``roles`` keeps each keyed op alive, so ids are exact.
        object.__setattr__(self, "_by_id", {id(target): role for target, role in self.roles.items()})

    def role(self, node: Node) -> Role | None:
        """The role of a ``call_function`` node, or None for anything else."""
        if node.op != "call_function":
            return None
        return self._by_id.get(id(node.target))

    def is_a(self, node: Node, *roles: Role) -> bool:
        """Whether the node plays one of ``roles``."""
        return self.role(node) in roles


#: The quantize/dequantize ops a quantized graph holds, as ``(namespace, op, overload)``; each table
#: resolves them in its dialect.
_QUANTIZATION = {
    ("quantized_decomposed", "quantize_per_tensor", "default"): Role.QUANTIZE,
    ("quantized_decomposed", "quantize_per_tensor", "tensor"): Role.QUANTIZE,
    ("quantized_decomposed", "quantize_per_tensor", "tensor2"): Role.QUANTIZE,
    ("quantized_decomposed", "quantize_per_channel", "default"): Role.QUANTIZE,
    ("quantized_decomposed", "quantize_per_channel_group", "default"): Role.QUANTIZE,
    ("quantized_decomposed", "quantize_per_token", "default"): Role.QUANTIZE,
    ("torchao", "quantize_affine", "default"): Role.QUANTIZE,
    ("torchao", "quantize_affine_float8_non_decomposed", "default"): Role.QUANTIZE,
    ("quantized_decomposed", "dequantize_per_tensor", "default"): Role.DEQUANTIZE,
    ("quantized_decomposed", "dequantize_per_tensor", "tensor"): Role.DEQUANTIZE,
    ("quantized_decomposed", "dequantize_per_tensor", "tensor2"): Role.DEQUANTIZE,
    ("quantized_decomposed", "dequantize_per_channel", "default"): Role.DEQUANTIZE,
    ("quantized_decomposed", "dequantize_per_channel_group", "default"): Role.DEQUANTIZE,
    ("quantized_decomposed", "dequantize_per_token", "default"): Role.DEQUANTIZE,
    ("torchao", "dequantize_affine", "default"): Role.DEQUANTIZE,
    ("torchao", "dequantize_affine_float8_non_decomposed", "default"): Role.DEQUANTIZE,
}


def _quantization_ops(namespace_of) -> dict[Any, Role]:
    """:data:`_QUANTIZATION` with each op looked up in the namespaces ``namespace_of`` gives."""
    return {
        getattr(getattr(getattr(namespace_of, ns), op), overload): role
        for (ns, op, overload), role in _QUANTIZATION.items()
    }


CAPTURE = OpTable(
    dialect="capture",
    roles={
        aten.to.dtype: Role.CAST,
        aten.to.dtype_layout: Role.CAST,
        aten.to.device: Role.CAST,
        aten.to.other: Role.CAST,
        aten.type_as.default: Role.CAST,
        aten._to_copy.default: Role.CAST,
        aten.mean.dim: Role.MEAN,
        aten.mul.Tensor: Role.MUL,
        aten.mul.Scalar: Role.MUL,
        aten.div.Tensor: Role.DIV,
        aten.add.Tensor: Role.ADD,
        aten.add.Scalar: Role.ADD,
        aten.pow.Tensor_Scalar: Role.POW,
        aten.pow.Tensor_Tensor: Role.POW,
        aten.square.default: Role.SQUARE,
        aten.rsqrt.default: Role.RSQRT,
        aten.sqrt.default: Role.SQRT,
        aten.reciprocal.default: Role.RECIPROCAL,
        aten.view.default: Role.RESHAPE,
        aten.reshape.default: Role.RESHAPE,
        aten._unsafe_view.default: Role.RESHAPE,
        aten.flatten.using_ints: Role.RESHAPE,
        aten.unflatten.int: Role.RESHAPE,
        # views that reorder dims; edge graphs copy instead (permute_copy), so no edge op is one
        aten.transpose.int: Role.PERMUTE,
        aten.swapaxes.default: Role.PERMUTE,
        aten.swapdims.default: Role.PERMUTE,
        aten.permute.default: Role.PERMUTE,
        aten.movedim.int: Role.PERMUTE,
        aten.movedim.intlist: Role.PERMUTE,
        aten.rms_norm.default: Role.RMS_NORM,
        aten.gelu.default: Role.GELU,
        aten._assert_tensor_metadata.default: Role.ASSERT_METADATA,
        **_quantization_ops(torch.ops),
    },
    rms_norm=aten.rms_norm.default,
    view=aten.view.default,
)

EDGE = OpTable(
    dialect="edge",
    roles={
        exir_ops.edge.dim_order_ops._to_dim_order_copy.default: Role.CAST,
        edge.aten._to_copy.default: Role.CAST,
        edge.aten.mean.dim: Role.MEAN,
        edge.aten.mul.Tensor: Role.MUL,
        edge.aten.mul.Scalar: Role.MUL,
        edge.aten.div.Tensor: Role.DIV,
        edge.aten.add.Tensor: Role.ADD,
        edge.aten.add.Scalar: Role.ADD,
        edge.aten.pow.Tensor_Scalar: Role.POW,
        edge.aten.pow.Tensor_Tensor: Role.POW,
        edge.aten.square.default: Role.SQUARE,
        edge.aten.rsqrt.default: Role.RSQRT,
        edge.aten.sqrt.default: Role.SQRT,
        edge.aten.reciprocal.default: Role.RECIPROCAL,
        edge.aten.view_copy.default: Role.RESHAPE,
        edge.aten.rms_norm.default: Role.RMS_NORM,
        edge.aten.gelu.default: Role.GELU,
        **_quantization_ops(edge),
    },
    rms_norm=edge.aten.rms_norm.default,
    view=edge.aten.view_copy.default,
)

TABLES = (CAPTURE, EDGE)


def is_edge_graph(graph: Graph) -> bool:
    """Whether any node of the graph calls an ExecuTorch edge op."""
    return any(
        node.op == "call_function" and isinstance(node.target, EdgeOpOverload) for node in graph.nodes
    )


def table_for(graph: Graph) -> OpTable:
    """The table of the graph's dialect: edge if it calls any edge op, captured ATen otherwise."""
    return EDGE if is_edge_graph(graph) else CAPTURE
