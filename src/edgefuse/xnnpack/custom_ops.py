"""Placeholder ops that carry a mean, a cast, a scalar add and a tanh GELU through the XNNPACK delegate's preprocessing.

The released delegate keys its node visitors and its layout rules by op target: ``aten.mean.dim`` always
becomes global average pooling in NHWC, and every ``aten._to_copy`` whose input and output are both NCHW
is deleted by ``RemoveRedundantCopyPass``, dtype casts included. Giving the means and casts edgefuse
delegates its own targets (``edgefuse::xnn_mean`` and ``edgefuse::xnn_convert``) lets edgefuse choose
their serialization without touching the installed package or any other program's lowering. The
released delegate has no config for ``aten.add.Scalar``, which ``torch.nn.RMSNorm`` decomposes its eps
add into; ``edgefuse::xnn_add_scalar`` carries it as an add of a constant. Its visitor serializes every
``aten.gelu`` as the erf GELU, dropping ``approximate``; ``edgefuse::xnn_gelu_tanh`` carries the tanh form
(Gemma's ``gelu_pytorch_tanh``), which the delegate then builds from its multiplies, adds and tanh.

The ops have a CPU kernel that computes exactly what the ATen op they replace computes, so the edge
program can still be run in Python. They have no ExecuTorch kernel: :mod:`edgefuse.xnnpack.substitute`
turns every one the partitioner leaves outside a delegate back into the ATen op.
"""

from __future__ import annotations

import torch
from torch.library import Library

from executorch.exir.dialects._ops import ops as exir_ops

NAMESPACE = "edgefuse"

_lib = Library(NAMESPACE, "DEF")
_lib.define("xnn_mean(Tensor self, int[] dims, bool keepdim) -> Tensor")
_lib.define("xnn_convert(Tensor self, ScalarType dtype) -> Tensor")
_lib.define("xnn_add_scalar(Tensor self, float other) -> Tensor")
_lib.define("xnn_gelu_tanh(Tensor self) -> Tensor")


def _mean(x: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
    """``aten.mean.dim``: an empty ``dims`` averages over every dim, as in PyTorch."""
    return torch.mean(x, dim=list(dims) if dims else list(range(x.dim())), keepdim=keepdim)


def _convert(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype=dtype, copy=True)


def _add_scalar(x: torch.Tensor, other: float) -> torch.Tensor:
    return torch.add(x, other)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


_lib.impl("xnn_mean", _mean, "CompositeExplicitAutograd")
_lib.impl("xnn_add_scalar", _add_scalar, "CompositeExplicitAutograd")
_lib.impl("xnn_convert", _convert, "CompositeExplicitAutograd")
_lib.impl("xnn_gelu_tanh", _gelu_tanh, "CompositeExplicitAutograd")

#: The ops as ``torch.ops`` overloads and as edge-dialect targets (what the graph holds after ``to_edge``).
XNN_MEAN = torch.ops.edgefuse.xnn_mean.default
XNN_CONVERT = torch.ops.edgefuse.xnn_convert.default
XNN_ADD_SCALAR = torch.ops.edgefuse.xnn_add_scalar.default
XNN_GELU_TANH = torch.ops.edgefuse.xnn_gelu_tanh.default
EDGE_XNN_MEAN = exir_ops.edge.edgefuse.xnn_mean.default
EDGE_XNN_CONVERT = exir_ops.edge.edgefuse.xnn_convert.default
EDGE_XNN_ADD_SCALAR = exir_ops.edge.edgefuse.xnn_add_scalar.default
EDGE_XNN_GELU_TANH = exir_ops.edge.edgefuse.xnn_gelu_tanh.default
