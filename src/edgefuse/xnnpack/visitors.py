"""Node visitors that serialize edgefuse's mean, cast, scalar add and tanh GELU with node types the released runtime has.

``edgefuse.xnn_mean`` becomes the nodes of :func:`edgefuse.xnnpack.mean_plan.plan_mean`
(``XNNFullyConnected`` against a constant ``1/W`` row, ``XNNGlobalAvgPooling2d``, ``XNNStaticReshape``);
a fully-connected step of a float16 mean, and every step of a bfloat16 mean, runs in float32 between
two ``XNNConvert`` nodes (see :func:`_step_dtype`).
``edgefuse.xnn_convert`` becomes one ``XNNConvert``, ``edgefuse.xnn_add_scalar`` one ``XNNAdd`` of a
constant, ``edgefuse.xnn_gelu_tanh`` the float32 multiplies, adds and ``XNNTanh`` of
:data:`GELU_TANH_STEPS`. No node type is new, so the programs load on the released 1.5.1 runtime.

Importing this module registers the visitors with the delegate (``register_node_visitor`` keys them by
their own targets, so no stock visitor is replaced) and adds the mean to the layout pass's set of ops
that need NCHW inputs: the plan reduces NCHW dims, and a channels-last input (a graph input, or a
convolution's output) then gets the one transpose it needs instead of averaging the wrong axes.
"""

from __future__ import annotations

import hashlib
import math
from typing import Dict

import torch
from torch.fx import Node

from executorch.backends.transforms import get_shape
from executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass import (
    ChannelsLastTaggedReshapePass,
)
from executorch.backends.xnnpack.operators.node_visitor import NodeVisitor, register_node_visitor
from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import (
    ConstantDataOffset,
    XNNAdd,
    XNNConvert,
    XNNDatatype,
    XNNFullyConnected,
    XNNGlobalAvgPooling2d,
    XNNGraph,
    XNNMultiply,
    XNNStaticReshape,
    XNNTanh,
    XNNTensorValue,
    XNode,
    XValue,
)
from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import CONSTANT_TENSOR_ALIGNMENT
from executorch.backends.xnnpack.utils.xnnpack_constants import (
    UINT64_MAX,
    XNN_FLAG_KEEP_DIMS,
    XNN_INVALID_VALUE_ID,
)

from edgefuse.xnnpack.custom_ops import EDGE_XNN_ADD_SCALAR, EDGE_XNN_CONVERT, EDGE_XNN_GELU_TANH, EDGE_XNN_MEAN
from edgefuse.xnnpack.mean_plan import DYNAMIC, FULLY_CONNECTED_KINDS, PlanError, Step, plan_mean

_XNN_DTYPES = {
    torch.float32: XNNDatatype.xnn_datatype_fp32,
    torch.float16: XNNDatatype.xnn_datatype_fp16,
    torch.bfloat16: XNNDatatype.xnn_datatype_bf16,
}

#: Dtypes XNNPACK reduces in directly; any other float mean runs in float32.
_REDUCE_DTYPES = frozenset({torch.float32, torch.float16})


class LayoutError(RuntimeError):
    """The delegate's layout pass handed a mean an input in a layout edgefuse did not ask for."""


def input_shape(node: Node) -> tuple[tuple[int | None, ...], tuple[int, ...]]:
    """The shape of a node's first input (None for a run-time dim) and its upper bounds."""
    source = node.args[0]
    value = source.meta["val"]
    shape = tuple(int(s) if isinstance(s, int) else DYNAMIC for s in value.shape)
    bounds = tuple(int(b) for b in get_shape(source))
    return shape, bounds


def mean_plan_of(node: Node) -> list[Step]:
    """The plan for an ``edgefuse.xnn_mean`` node; raises :class:`PlanError` when there is none."""
    shape, bounds = input_shape(node)
    return plan_mean(shape, list(node.args[1]), bool(node.args[2]), bounds)


def _is_nhwc(node: Node) -> bool:
    return bool(node.meta.get(ChannelsLastTaggedReshapePass.XNN_NHWC_NODE, False))


class _EdgefuseVisitor(NodeVisitor):
    """Helpers to define values that have no node in the edge graph."""

    def _internal_value(self, xnn_graph: XNNGraph, dims, dtype: torch.dtype) -> int:
        value_id = len(xnn_graph.xvalues)
        dims = [int(d) for d in dims] or [1]
        xnn_graph.xvalues.append(
            XValue(
                xvalue_union=XNNTensorValue(
                    datatype=_XNN_DTYPES[dtype],
                    num_dims=len(dims),
                    dims=dims,
                    constant_buffer_idx=0,
                    external_id=XNN_INVALID_VALUE_ID,
                    flags=0,
                    id_out=value_id,
                )
            )
        )
        return value_id

    def _constant_value(self, xnn_graph: XNNGraph, tensor: torch.Tensor) -> int:
        data = tensor.contiguous().numpy().tobytes() if tensor.dtype != torch.bfloat16 else (
            tensor.contiguous().view(torch.int16).numpy().tobytes()
        )
        key = hashlib.sha256(data).hexdigest()
        buffer_index = len(xnn_graph.constant_data)
        xnn_graph.constant_data.append(ConstantDataOffset(offset=UINT64_MAX, size=len(data), named_key=key))
        self._named_data_store.add_named_data(key, data, alignment=CONSTANT_TENSOR_ALIGNMENT)
        value_id = len(xnn_graph.xvalues)
        xnn_graph.xvalues.append(
            XValue(
                xvalue_union=XNNTensorValue(
                    datatype=_XNN_DTYPES[tensor.dtype],
                    num_dims=tensor.dim(),
                    dims=list(tensor.shape),
                    constant_buffer_idx=buffer_index,
                    external_id=XNN_INVALID_VALUE_ID,
                    flags=0,
                    id_out=value_id,
                )
            )
        )
        return value_id

    @staticmethod
    def _append(xnn_graph: XNNGraph, union, debug_handle: int) -> None:
        xnn_graph.xnodes.append(XNode(xnode_union=union, debug_handle=debug_handle))


@register_node_visitor
class XnnMeanVisitor(_EdgefuseVisitor):
    """Serializes ``edgefuse.xnn_mean`` as the nodes of its plan, reading and writing NCHW."""

    target = EDGE_XNN_MEAN.__name__

    def define_node(self, node: Node, xnn_graph: XNNGraph, vals_to_ids: Dict[Node, int], debug_handle: int) -> None:
        source = node.args[0]
        if _is_nhwc(source) or _is_nhwc(node):
            raise LayoutError(
                f"{node.name}: the layout pass gave the mean a channels-last tensor, but edgefuse registers "
                "the mean as an op that needs NCHW inputs; was edgefuse.xnnpack.visitors imported before "
                "lowering?"
            )
        try:
            steps = mean_plan_of(node)
        except PlanError as error:
            raise PlanError(f"{node.name}: {error} (the partitioner should not have taken this mean)") from None
        self.define_tensor(source, xnn_graph, vals_to_ids)
        self.define_tensor(node, xnn_graph, vals_to_ids)
        dtype = source.meta["val"].dtype
        current, current_dtype, current_bound = vals_to_ids[source], dtype, get_shape(source)
        for index, step in enumerate(steps):
            wanted = _step_dtype(step, current_dtype)
            if wanted != current_dtype:
                converted = self._internal_value(xnn_graph, current_bound, wanted)
                self._append(xnn_graph, XNNConvert(input_id=current, output_id=converted, flags=0), debug_handle)
                current, current_dtype = converted, wanted
            last = index == len(steps) - 1 and current_dtype == dtype
            out = vals_to_ids[node] if last else self._internal_value(xnn_graph, step.bound, current_dtype)
            if step.kind == "reshape":
                new_shape = [0 if s is DYNAMIC else s for s in step.shape]
                union = XNNStaticReshape(
                    num_dims=len(new_shape), new_shape=new_shape, input_id=current, output_id=out, flags=0
                )
            elif step.kind in FULLY_CONNECTED_KINDS:
                row = self._constant_value(
                    xnn_graph, torch.full((1, step.width), 1.0 / step.width, dtype=torch.float64).to(current_dtype)
                )
                data, weights = (current, row) if step.kind == "fully_connected" else (row, current)
                union = XNNFullyConnected(
                    input1_id=data, filter_id=weights, bias_id=XNN_INVALID_VALUE_ID, output_id=out, flags=0
                )
            elif step.kind == "global_avg_pool":
                union = XNNGlobalAvgPooling2d(input_id=current, output_id=out, flags=XNN_FLAG_KEEP_DIMS)
            else:
                raise PlanError(f"{node.name}: unknown plan step {step.kind!r}")
            self._append(xnn_graph, union, debug_handle)
            current, current_bound = out, step.bound
        if current_dtype != dtype:
            self._append(xnn_graph, XNNConvert(input_id=current, output_id=vals_to_ids[node], flags=0), debug_handle)


def _step_dtype(step: Step, current: torch.dtype) -> torch.dtype:
    """The dtype a plan step runs in, given the dtype of its input.

    Fully-connected steps run in float32: a float16 ``1/W`` row is off by up to half a float16 unit,
    and far more once ``1/W`` is subnormal (``W`` over 16384: 2% at ``W = 783363``), and XNNPACK's
    float16 fully-connected returns -inf for a row holding a NaN. Global average pooling, which keeps
    its scale in float32 and NaNs as NaNs, runs in float16 too; a bfloat16 mean, which XNNPACK cannot
    reduce, runs entirely in float32.
    """
    if step.kind in FULLY_CONNECTED_KINDS or current not in _REDUCE_DTYPES:
        return torch.float32
    return current


@register_node_visitor
class XnnConvertVisitor(_EdgefuseVisitor):
    """Serializes ``edgefuse.xnn_convert`` as one ``XNNConvert`` in whatever layout its input has."""

    target = EDGE_XNN_CONVERT.__name__

    def define_node(self, node: Node, xnn_graph: XNNGraph, vals_to_ids: Dict[Node, int], debug_handle: int) -> None:
        self.define_nodes_tensor_inputs_outputs(node, xnn_graph, vals_to_ids)
        source = node.args[0]
        self._append(
            xnn_graph,
            XNNConvert(input_id=vals_to_ids[source], output_id=vals_to_ids[node], flags=0),
            debug_handle,
        )


@register_node_visitor
class XnnAddScalarVisitor(_EdgefuseVisitor):
    """Serializes ``edgefuse.xnn_add_scalar`` as one ``XNNAdd`` of its input and a one-value constant."""

    target = EDGE_XNN_ADD_SCALAR.__name__

    def define_node(self, node: Node, xnn_graph: XNNGraph, vals_to_ids: Dict[Node, int], debug_handle: int) -> None:
        self.define_nodes_tensor_inputs_outputs(node, xnn_graph, vals_to_ids)
        source = node.args[0]
        constant = torch.tensor([node.args[1]], dtype=torch.float64).to(source.meta["val"].dtype)
        self._append(
            xnn_graph,
            XNNAdd(
                input1_id=vals_to_ids[source],
                input2_id=self._constant_value(xnn_graph, constant),
                output_id=vals_to_ids[node],
                flags=0,
            ),
            debug_handle,
        )


#: The tanh GELU as ATen's CPU kernel computes it, in float32 and in its order:
#: ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x * x * x)))``. Each step is
#: ``(result, node type, first operand, second operand)``: an operand is an earlier result or ``x``, a number
#: a float32 constant; ``y`` is the output.
GELU_TANH_STEPS = (
    ("square", XNNMultiply, "x", "x"),
    ("cube", XNNMultiply, "square", "x"),
    ("scaled_cube", XNNMultiply, 0.044715, "cube"),
    ("inner", XNNAdd, "x", "scaled_cube"),
    ("argument", XNNMultiply, math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5, "inner"),
    ("tanh", XNNTanh, "argument", None),
    ("one_plus", XNNAdd, 1.0, "tanh"),
    ("half_x", XNNMultiply, 0.5, "x"),
    ("y", XNNMultiply, "half_x", "one_plus"),
)


@register_node_visitor
class XnnGeluTanhVisitor(_EdgefuseVisitor):
    """Serializes ``edgefuse.xnn_gelu_tanh`` as :data:`GELU_TANH_STEPS` in float32; a float16 or bfloat16
    input is converted to float32 first and the result back once, as ATen's kernel computes a half GELU in
    float32 and rounds once."""

    target = EDGE_XNN_GELU_TANH.__name__

    def define_node(self, node: Node, xnn_graph: XNNGraph, vals_to_ids: Dict[Node, int], debug_handle: int) -> None:
        self.define_nodes_tensor_inputs_outputs(node, xnn_graph, vals_to_ids)
        source = node.args[0]
        dtype = source.meta["val"].dtype
        dims = xnn_graph.xvalues[vals_to_ids[source]].xvalue_union.dims  # in the layout the delegate gave it
        ids = {"x": vals_to_ids[source]}
        if dtype != torch.float32:
            ids["x"] = self._internal_value(xnn_graph, dims, torch.float32)
            self._append(xnn_graph, XNNConvert(input_id=vals_to_ids[source], output_id=ids["x"], flags=0), debug_handle)

        def operand(name_or_number) -> int:
            if isinstance(name_or_number, str):
                return ids[name_or_number]
            return self._constant_value(xnn_graph, torch.tensor([name_or_number], dtype=torch.float64).float())

        for result, kind, first, second in GELU_TANH_STEPS:
            last = result == "y" and dtype == torch.float32
            ids[result] = vals_to_ids[node] if last else self._internal_value(xnn_graph, dims, torch.float32)
            if second is None:
                union = kind(input_id=operand(first), output_id=ids[result], flags=0)
            else:
                union = kind(input1_id=operand(first), input2_id=operand(second), output_id=ids[result], flags=0)
            self._append(xnn_graph, union, debug_handle)
        if dtype != torch.float32:
            self._append(xnn_graph, XNNConvert(input_id=ids["y"], output_id=vals_to_ids[node], flags=0), debug_handle)


ChannelsLastTaggedReshapePass.memory_sensitive_ops_nchw.add(EDGE_XNN_MEAN)
