"""Partitioner configs: the means, casts, scalar adds, squares and tanh GELUs edgefuse hands to the XNNPACK
delegate, and the GELUs it keeps from it.

Each config is a stock ``XNNPartitionerConfig``: the partitioner builds it with every keyword argument
it was given, so edgefuse's options (``single_row``) reach the configs the same way ``enable_bf16``
does. A config that shares a stock config's ``target_name`` replaces it (see
:mod:`edgefuse.xnnpack.partitioner`); duplicate target names raise in the stock partitioner.
"""

from __future__ import annotations

import logging
from typing import List

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from executorch.backends.xnnpack.partition.config.generic_node_configs import GeluConfig, GenericNodePartitionerConfig
from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
from executorch.exir.backend.utils import WhyNoPartition

from edgefuse.xnnpack.mean_plan import PlanError, rows, width
from edgefuse.xnnpack.policy import DEFAULT_SINGLE_ROW_POLICY, check_policy, keep_portable
from edgefuse.xnnpack.substitute import gelu_approximate
from edgefuse.xnnpack.visitors import input_shape, mean_plan_of

logger = logging.getLogger(__name__)
why = WhyNoPartition(logger=logger)

#: Casts XNNPACK's convert runs: float16 <-> float32 always, bfloat16 <-> float32 with ``enable_bf16``.
CONVERT_PAIRS = frozenset(
    {
        (torch.float16, torch.float32),
        (torch.float32, torch.float16),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.bfloat16),
    }
)


class XnnMeanConfig(GenericNodePartitionerConfig):
    """Takes an ``edgefuse.xnn_mean`` that has a plan and that the single-row policy does not keep out."""

    target_name = "xnn_mean.default"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.single_row = check_policy(kwargs.get("single_row", DEFAULT_SINGLE_ROW_POLICY))

    def check_constraints(self, node: Node, ep: ExportedProgram) -> bool:
        if not self.check_common_constraints(node, ep):
            return False
        try:
            mean_plan_of(node)
        except PlanError as error:
            why(node, reason=str(error))
            return False
        shape, _ = input_shape(node)
        dims = list(node.args[1])
        reason = keep_portable(
            self.single_row, rows(shape, dims), node.args[0].meta["val"].dtype, width(shape, dims)
        )
        if reason:
            why(node, reason=reason)
            return False
        return True

    def supported_precision_types(self) -> List[ConfigPrecisionType]:
        return [ConfigPrecisionType.FP32]


class XnnConvertConfig(GenericNodePartitionerConfig):
    """Takes an ``edgefuse.xnn_convert`` between float32 and a half type the delegate is enabled for."""

    target_name = "xnn_convert.default"

    def check_constraints(self, node: Node, ep: ExportedProgram) -> bool:
        if not self.check_common_constraints(node, ep):
            return False
        pair = (node.args[0].meta["val"].dtype, node.meta["val"].dtype)
        if pair not in CONVERT_PAIRS:
            why(node, reason=f"XNNPACK has no convert from {pair[0]} to {pair[1]}")
            return False
        return True

    def supported_precision_types(self) -> List[ConfigPrecisionType]:
        return [ConfigPrecisionType.FP32]


class _SubstitutedOpConfig(GenericNodePartitionerConfig):
    """Takes an op :mod:`edgefuse.xnnpack.substitute` chose already, on the delegate's common checks alone."""

    def check_constraints(self, node: Node, ep: ExportedProgram) -> bool:
        return self.check_common_constraints(node, ep)

    def supported_precision_types(self) -> List[ConfigPrecisionType]:
        return [ConfigPrecisionType.FP32]


class XnnAddScalarConfig(_SubstitutedOpConfig):
    """Takes an ``edgefuse.xnn_add_scalar`` (see :mod:`edgefuse.xnnpack.substitute` for which adds)."""

    target_name = "xnn_add_scalar.default"


class XnnGeluTanhConfig(_SubstitutedOpConfig):
    """Takes an ``edgefuse.xnn_gelu_tanh`` (see :mod:`edgefuse.xnnpack.substitute` for which GELUs); a GELU
    all the same, so it goes with the stock ``GeluConfig``: a config list without that keeps it out."""

    target_name = "xnn_gelu_tanh.default"
    amends = GeluConfig.target_name


class SquarePowConfig(GenericNodePartitionerConfig):
    """Replaces the stock ``PowConfig``: takes ``pow(x, 2)`` with the exponent an int or the float 2.0.

    The stock visitor serializes every ``pow.Tensor_Scalar`` it is given as ``XNNSquare``, so only the
    exponent check changes; ``x * x`` already lowers as a multiply.
    """

    target_name = "pow.Tensor_Scalar"

    def check_constraints(self, node: Node, ep: ExportedProgram) -> bool:
        if not self.check_common_constraints(node, ep):
            return False
        power = node.args[1]
        if isinstance(power, bool) or not isinstance(power, (int, float)) or power != 2:
            why(node, reason=f"only pow(x, 2) is a square, got exponent {power!r}")
            return False
        return True

    def supported_precision_types(self) -> List[ConfigPrecisionType]:
        return [ConfigPrecisionType.FP32]


class ExactGeluConfig(GeluConfig):
    """Replaces the stock ``GeluConfig``: takes only the erf GELU, the one XNNPACK computes.

    The released visitor serializes every ``gelu`` as ``XNNGelu``, dropping ``approximate``: a
    ``gelu(x, approximate="tanh")`` (Gemma's ``gelu_pytorch_tanh``) would compute the erf form, up to
    4.7e-4 away at ``x = -2.70``. :class:`~edgefuse.xnnpack.substitute.SubstituteForXnnpack` turns the tanh
    form into ``edgefuse.xnn_gelu_tanh`` before partitioning; one that reaches this config (that substitution
    turned off) stays on the portable kernel, which computes it.
    """

    def check_constraints(self, node: Node, ep: ExportedProgram) -> bool:
        approximate = gelu_approximate(node)
        if approximate != "none":
            why(node, reason=f"XNNPACK computes only the erf GELU, not approximate={approximate!r}")
            return False
        return super().check_constraints(node, ep)


EDGEFUSE_CONFIGS = (
    XnnMeanConfig, XnnConvertConfig, XnnAddScalarConfig, XnnGeluTanhConfig, SquarePowConfig, ExactGeluConfig,
)
