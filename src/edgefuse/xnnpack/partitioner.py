"""The drop-in for ``XnnpackPartitioner``: the stock configs, with edgefuse's mean, cast, square and GELUs.

``EdgefuseXnnpackPartitioner(**kwargs)`` takes every keyword argument ``XnnpackPartitioner`` takes
(``configs``, ``config_precisions``, ``per_op_mode``, ``verbose``, ``enable_bf16``, ...) plus
edgefuse's own ``single_row`` (see :mod:`edgefuse.xnnpack.policy`). Given ``configs``, it adds
edgefuse's configs to that list instead of to the stock one.

The partitioner only chooses nodes; ExecuTorch forbids a partitioner to change the graph. The means and
casts it delegates are the ``edgefuse`` ops that :class:`~edgefuse.xnnpack.substitute.SubstituteForXnnpack`
puts in the graph before partitioning, and :class:`~edgefuse.xnnpack.substitute.RestoreUndelegated`
must run after it; :func:`edgefuse.xnnpack.lower` does all three. On a graph without edgefuse ops it
partitions like stock, except that ``pow(x, 2.0)`` is taken as a square, and that a tanh GELU left as
``aten.gelu`` (the delegate would compute it as the erf GELU), and any node with a tensor of more than six dims, which the
runtime cannot define (stock's program then fails to load), are left out.
"""

from __future__ import annotations

from typing import List, Optional, Type

import torch
from torch.utils import _pytree as pytree

from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
from executorch.backends.xnnpack.partition.config.xnnpack_config import XNNPartitionerConfig
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

import edgefuse.xnnpack.visitors  # noqa: F401  (registers the visitors the delegated ops need)
from edgefuse.xnnpack.configs import EDGEFUSE_CONFIGS
from edgefuse.xnnpack.mean_plan import MAX_RANK

#: The targets stock configs take: an edgefuse config with one of these amends that stock config.
STOCK_TARGETS = frozenset(getattr(config, "target_name", None) for config in ALL_PARTITIONER_CONFIGS)
from edgefuse.xnnpack.policy import DEFAULT_SINGLE_ROW_POLICY, check_policy


def edgefuse_configs(base: Optional[List[Type[XNNPartitionerConfig]]] = None) -> list[Type[XNNPartitionerConfig]]:
    """``base`` (by default every stock config) with edgefuse's configs: those for edgefuse's own ops
    added, those that amend a stock config (the square, the erf GELU, and the tanh GELU, whose config
    names the stock one it ``amends``) only where ``base`` has that config, so a list without a stock
    config keeps that op out as stock would."""
    base = list(base or ALL_PARTITIONER_CONFIGS)
    names = {getattr(config, "target_name", None) for config in base}
    ours = [c for c in EDGEFUSE_CONFIGS if stock_config_of(c) in names | {None}]
    replaced = {config.target_name for config in ours}
    return [config for config in base if getattr(config, "target_name", None) not in replaced] + ours


def stock_config_of(config: Type[XNNPartitionerConfig]) -> Optional[str]:
    """The target of the stock config an edgefuse config goes with: the one it ``amends``, or the stock one it
    replaces (same target); None for a config of an op only edgefuse has."""
    target = config.target_name
    return getattr(config, "amends", target if target in STOCK_TARGETS else None)


class EdgefuseXnnpackPartitioner(XnnpackPartitioner):
    """``XnnpackPartitioner`` with edgefuse's configs; ``single_row`` picks the single-row mean policy."""

    def __init__(self, configs=None, config_precisions=None, per_op_mode=False, verbose=False,
                 single_row: str = DEFAULT_SINGLE_ROW_POLICY, **kwargs):
        self.single_row = check_policy(single_row)
        super().__init__(
            configs=edgefuse_configs(configs),
            config_precisions=config_precisions,
            per_op_mode=per_op_mode,
            verbose=verbose,
            single_row=single_row,
            **kwargs,
        )
        for config in self.target_partitioner_configs.values():
            config.check_constraints = _within_max_rank(config.check_constraints)


def _within_max_rank(check):
    """``check``, refusing first a node that reads or makes a tensor of more dims than XNNPACK defines:
    stock configs delegate such a node and the program then fails to load (a rank-7 ``pow``)."""
    def checked(node, ep) -> bool:
        values = [node.meta.get("val"), *(arg.meta.get("val") for arg in node.all_input_nodes)]
        tensors = [v for v in pytree.tree_leaves(values) if isinstance(v, torch.Tensor)]
        return all(t.dim() <= MAX_RANK for t in tensors) and check(node, ep)

    return checked
