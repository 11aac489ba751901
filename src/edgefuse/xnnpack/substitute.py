"""The two graph passes around partitioning: swap means, casts, scalar adds and tanh GELUs for edgefuse's ops, and back.

:class:`SubstituteForXnnpack` runs on the edge program before partitioning. It replaces

- every float ``mean.dim`` except the ones stock lowers already (a 4-D mean over dims [2, 3] with
  keepdim in float32 or float16, which stays global average pooling so its ``.pte`` is byte-identical
  to stock), a mean with an explicit ``dtype``, and a mean of a dequantized 4-D tensor in a graph
  that XNNPACK's layout pass may turn channels-last (it holds a convolution, a pooling, ...: the
  delegate's dequantize would then hand the mean a channels-last tensor), with ``edgefuse.xnn_mean``.
  Any other mean of a dequantized tensor (a statically quantized norm's ``mean(x * x)``, a QK norm's
  over ``[B, T, H, D]``) reads the delegate's float convert of it, as stock's portable mean reads the
  portable dequantize;
- every cast that changes only the dtype, between float32 and float16 or bfloat16, with
  ``edgefuse.xnn_convert``;
- every ``add.Scalar`` of a float32 or float16 tensor, with alpha 1, with ``edgefuse.xnn_add_scalar``:
  ``torch.nn.RMSNorm`` adds its eps that way, and the released delegate takes no ``add.Scalar``. The
  delegate adds the scalar rounded to the tensor's dtype, as eager's ``add.Scalar`` does;
- every ``gelu(x, approximate="tanh")`` of a float32, float16 or bfloat16 tensor with
  ``edgefuse.xnn_gelu_tanh``: the released visitor would serialize it as the erf GELU. The delegate
  computes it in float32 from multiplies, adds and a tanh, in eager's order, and rounds once to the
  tensor's dtype, as eager's kernel does.

:class:`RestoreUndelegated` runs on the lowered program and turns every edgefuse op left outside a
delegate (refused by a config, or by the single-row policy) back into the op it replaced, with the
same arguments, so the program needs no kernel ExecuTorch does not have. Each substituted node keeps
what it replaced in ``node.meta[ORIGINAL]``.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from edgefuse.core.casts import changes_only_dtype, dtype_of
from edgefuse.core.ops import EDGE, Role
from edgefuse.xnnpack.custom_ops import EDGE_XNN_ADD_SCALAR, EDGE_XNN_CONVERT, EDGE_XNN_GELU_TANH, EDGE_XNN_MEAN
from edgefuse.xnnpack.mean_plan import PlanError, normalize_dims

#: The ops :class:`SubstituteForXnnpack` puts in a graph, which :class:`RestoreUndelegated` takes back out.
EDGEFUSE_OPS = (EDGE_XNN_MEAN, EDGE_XNN_CONVERT, EDGE_XNN_ADD_SCALAR, EDGE_XNN_GELU_TANH)

#: ``node.meta`` key holding ``(target, args after the tensor, kwargs)`` of the op a node replaced.
ORIGINAL = "edgefuse_xnnpack_original"

_FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})
_CONVERT_PAIRS = frozenset(
    {
        (torch.float16, torch.float32),
        (torch.float32, torch.float16),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.bfloat16),
    }
)


def is_stock_global_avg_pool(node: Node) -> bool:
    """Whether stock XNNPACK already lowers this mean: 4-D, dims [2, 3], keepdim, float32 or float16."""
    value = node.args[0].meta.get("val")
    if value is None or value.dim() != 4 or value.dtype not in (torch.float32, torch.float16):
        return False
    keepdim = len(node.args) > 2 and bool(node.args[2])
    try:
        dims = normalize_dims(node.args[1] if len(node.args) > 1 else None, 4)
    except PlanError:
        return False
    return keepdim and dims == (2, 3)


def channels_last_possible(graph) -> bool:
    """Whether XNNPACK's layout pass may make some 4-D tensor of ``graph`` channels-last: an input is
    channels-last, or the graph holds an op that pass runs in NHWC (a convolution, a pooling, ...; a
    mean counts only if it stays stock's global average pooling, since edgefuse's mean needs NCHW)."""
    from executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass import ChannelsLastTaggedReshapePass

    nhwc = ChannelsLastTaggedReshapePass.memory_sensitive_ops_nhwc
    for node in graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder" and isinstance(value, torch.Tensor) and value.dim() == 4:
            if not value.is_contiguous():
                return True
        if node.op != "call_function" or node.target not in nhwc:
            continue
        if not EDGE.is_a(node, Role.MEAN) or is_stock_global_avg_pool(node):
            return True
    return False


def _is_dequantized(node: object) -> bool:
    return isinstance(node, Node) and EDGE.is_a(node, Role.DEQUANTIZE)


def mean_reason(node: Node) -> str | None:
    """Why a ``mean.dim`` node is not substituted, or None when it is."""
    source = node.args[0]
    dtype = dtype_of(source)
    if dtype not in _FLOATS or dtype_of(node) != dtype:
        return f"mean of {dtype} producing {dtype_of(node)}: edgefuse substitutes float means only"
    if node.kwargs.get("dtype") is not None:
        return "mean with an explicit dtype"
    if _is_dequantized(source) and source.meta["val"].dim() == 4 and channels_last_possible(node.graph):
        return ("mean of a dequantized tensor of rank 4 in a graph the layout pass may turn channels-last: "
                "the delegate's dequantize could hand it a channels-last tensor; stock path")
    if is_stock_global_avg_pool(node):
        return "4-D mean over dims [2, 3] with keepdim: stock global average pooling"
    try:
        normalize_dims(node.args[1] if len(node.args) > 1 else None, source.meta["val"].dim())
    except PlanError as error:
        return str(error)
    return None


def cast_reason(node: Node) -> str | None:
    """Why a cast node is not substituted, or None when it is."""
    if not changes_only_dtype(node, EDGE):
        return "the cast changes more than the dtype (or its dim order is ambiguous)"
    pair = (dtype_of(node.args[0]), dtype_of(node))
    if pair not in _CONVERT_PAIRS:
        return f"no XNNPACK convert from {pair[0]} to {pair[1]}"
    return None


def add_reason(node: Node) -> str | None:
    """Why an add of a scalar is not substituted, or None when it is (only ``add.Scalar`` gets here:
    in edge graphs an ``add.Tensor`` reads a lifted tensor, never a number)."""
    other = node.args[1] if len(node.args) > 1 else None
    if isinstance(other, bool) or not isinstance(other, (int, float)):
        return "the add reads a tensor, which the stock delegate takes"
    alpha = node.args[2] if len(node.args) > 2 else node.kwargs.get("alpha", 1)
    if alpha != 1:
        return f"add with alpha {alpha!r}"
    if isinstance(other, int) and abs(other) > 2**53:
        return f"the integer {other} is no float64 value: the delegate would round it twice"
    dtype = dtype_of(node.args[0])
    if dtype not in (torch.float32, torch.float16) or dtype_of(node) != dtype:
        return f"add of a scalar to {dtype}: edgefuse substitutes float32 and float16 adds only"
    value = node.args[0].meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return "add of a scalar to a 0-d tensor: the delegate cannot return a 0-d tensor"
    return None


def gelu_approximate(node: Node) -> str:
    """A ``gelu`` node's form: ``"none"`` (erf) or ``"tanh"`` (``approximate`` is keyword-only in its schema)."""
    return node.kwargs.get("approximate", "none")


def gelu_reason(node: Node) -> str | None:
    """Why a ``gelu`` node is not substituted, or None when it is (the tanh form of a float tensor)."""
    approximate = gelu_approximate(node)
    if approximate != "tanh":
        return f"GELU with approximate={approximate!r}: the stock delegate computes the erf GELU"
    dtype = dtype_of(node.args[0])
    if dtype not in _FLOATS or dtype_of(node) != dtype:
        return f"GELU of {dtype} producing {dtype_of(node)}: edgefuse substitutes float GELUs only"
    value = node.args[0].meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return "GELU of a 0-d tensor: the delegate cannot return a 0-d tensor"
    if _is_dequantized(node.args[0]):
        return "GELU of a dequantized tensor: the delegate could hand it a quantized value; stock path"
    return None


def _replace(graph, node: Node, target, args: tuple, original) -> Node:
    with graph.inserting_before(node):
        new = graph.call_function(target, args)
    new.meta = dict(node.meta)
    new.meta[ORIGINAL] = original
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return new


class SubstituteForXnnpack(PassBase):
    """Swap delegable means, casts, scalar adds and tanh GELUs for edgefuse's ops; ``substituted`` names the
    replaced nodes."""

    def __init__(self, means: bool = True, casts: bool = True, adds: bool = True, gelus: bool = True) -> None:
        super().__init__()
        self.means = means
        self.casts = casts
        self.adds = adds
        self.gelus = gelus
        self.substituted: list[str] = []

    def call(self, graph_module: GraphModule) -> PassResult:
        self.substituted = []
        graph = graph_module.graph
        for node in list(graph.nodes):
            if self.means and EDGE.is_a(node, Role.MEAN) and mean_reason(node) is None:
                rank = node.args[0].meta["val"].dim()
                dims = list(normalize_dims(node.args[1] if len(node.args) > 1 else None, rank))
                keepdim = len(node.args) > 2 and bool(node.args[2])
                original = (node.target, tuple(node.args[1:]), dict(node.kwargs))
                _replace(graph, node, EDGE_XNN_MEAN, (node.args[0], dims, keepdim), original)
                self.substituted.append(node.name)
            elif self.casts and EDGE.is_a(node, Role.CAST) and cast_reason(node) is None:
                original = (node.target, tuple(node.args[1:]), dict(node.kwargs))
                _replace(graph, node, EDGE_XNN_CONVERT, (node.args[0], dtype_of(node)), original)
                self.substituted.append(node.name)
            elif self.adds and EDGE.is_a(node, Role.ADD) and add_reason(node) is None:
                original = (node.target, tuple(node.args[1:]), dict(node.kwargs))
                _replace(graph, node, EDGE_XNN_ADD_SCALAR, (node.args[0], float(node.args[1])), original)
                self.substituted.append(node.name)
            elif self.gelus and EDGE.is_a(node, Role.GELU) and gelu_reason(node) is None:
                original = (node.target, tuple(node.args[1:]), dict(node.kwargs))
                _replace(graph, node, EDGE_XNN_GELU_TANH, (node.args[0],), original)
                self.substituted.append(node.name)
        if self.substituted:
            graph.lint()
            graph_module.recompile()
        return PassResult(graph_module, bool(self.substituted))


class RestoreUndelegated(PassBase):
    """Turn every edgefuse op left in the top-level graph back into the op it replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.restored: list[str] = []

    def call(self, graph_module: GraphModule) -> PassResult:
        self.restored = []
        graph = graph_module.graph
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in EDGEFUSE_OPS:
                continue
            original = node.meta.get(ORIGINAL)
            if original is None:
                raise RuntimeError(
                    f"{node.name}: an edgefuse {node.target} node without the op it replaced; only "
                    "SubstituteForXnnpack may create these nodes"
                )
            target, rest, kwargs = original
            with graph.inserting_before(node):
                new = graph.call_function(target, (node.args[0], *rest), kwargs)
            new.meta = {k: v for k, v in node.meta.items() if k != ORIGINAL}
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            self.restored.append(new.name)
        if self.restored:
            graph.lint()
            graph_module.recompile()
        return PassResult(graph_module, bool(self.restored))
