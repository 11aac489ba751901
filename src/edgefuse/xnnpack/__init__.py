"""Keep every norm and every mean inside the XNNPACK delegate of the released ExecuTorch (1.5.1).

The released delegate lowers a mean only as 4-D global average pooling and no dtype-changing cast, so
each RMSNorm splits the delegate. edgefuse swaps those means and casts for ops of its own before
partitioning and serializes them with node types the released runtime already has (fully-connected,
global average pooling, static reshape, convert), so the programs load on released runtimes.

- :func:`lower`: the whole flow, exported program in, lowered ``EdgeProgramManager`` out.
- :class:`EdgefuseXnnpackPartitioner`: the drop-in for ``XnnpackPartitioner``.
- :class:`SubstituteForXnnpack`, :class:`RestoreUndelegated`: the passes around partitioning.
- :mod:`edgefuse.xnnpack.policy`: the single-row mean policy; :mod:`edgefuse.xnnpack.inspect`: read
  back what a lowered program holds; ``python -m edgefuse.xnnpack.bench``: the benchmark.
"""

from edgefuse.xnnpack.lower import lower
from edgefuse.xnnpack.partitioner import EdgefuseXnnpackPartitioner, edgefuse_configs
from edgefuse.xnnpack.policy import DEFAULT_SINGLE_ROW_POLICY, SINGLE_ROW_POLICIES
from edgefuse.xnnpack.substitute import RestoreUndelegated, SubstituteForXnnpack

__all__ = [
    "DEFAULT_SINGLE_ROW_POLICY",
    "EdgefuseXnnpackPartitioner",
    "RestoreUndelegated",
    "SINGLE_ROW_POLICIES",
    "SubstituteForXnnpack",
    "edgefuse_configs",
    "lower",
]
