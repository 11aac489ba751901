"""Keep every norm and every mean inside the XNNPACK delegate of the released ExecuTorch (1.5.1).

The released delegate lowers a mean only as 4-D global average pooling and no dtype-changing cast, so
each RMSNorm splits the delegate. edgefuse swaps those means and casts for ops of its own before
partitioning and serializes them with node types the released runtime already has (fully-connected,
global average pooling, static reshape, convert), so the programs load on released runtimes.

- :func:`lower`: the whole flow, exported program in, lowered ``EdgeProgramManager`` out; :func:`lower_with`
  one named lowering (stock or edgefuse's).
- :func:`quantize`, :func:`export_quantized`: the qs8 and 8da4w flows; :class:`EdgefuseRecipeType`: the
  ``edgefuse_xnnpack`` export recipes (its first use registers their provider).
- :class:`EdgefuseXnnpackPartitioner`: the drop-in for ``XnnpackPartitioner``.
- :class:`SubstituteForXnnpack`, :class:`RestoreUndelegated`: the passes around partitioning.
- :mod:`edgefuse.xnnpack.policy`: the single-row mean policy; :mod:`edgefuse.xnnpack.inspect`: read
  back what a lowered program holds; ``python -m edgefuse.tools.xnnpack_bench``: the benchmark.

The names are imported on first use (PEP 562), as in :mod:`edgefuse`: running
``python -m edgefuse.tools.xnnpack_bench`` imports this package first, and the command silences the import-time
warnings of torch and torchao only if ExecuTorch is not loaded before it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefuse.core.lazy import lazy_names

#: Each public name and the module that defines it.
_PUBLIC: dict[str, str] = {
    "DEFAULT_SINGLE_ROW_POLICY": "edgefuse.xnnpack.policy",
    "EdgefuseRecipeType": "edgefuse.xnnpack.recipes",
    "EdgefuseXnnpackPartitioner": "edgefuse.xnnpack.partitioner",
    "RestoreUndelegated": "edgefuse.xnnpack.substitute",
    "SINGLE_ROW_POLICIES": "edgefuse.xnnpack.policy",
    "SubstituteForXnnpack": "edgefuse.xnnpack.substitute",
    "edgefuse_configs": "edgefuse.xnnpack.partitioner",
    "export_quantized": "edgefuse.xnnpack.quantizer",
    "lower": "edgefuse.xnnpack.lowering",
    "lower_with": "edgefuse.xnnpack.lowering",
    "quantize": "edgefuse.xnnpack.quantizer",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from edgefuse.xnnpack.lowering import lower, lower_with
    from edgefuse.xnnpack.partitioner import EdgefuseXnnpackPartitioner, edgefuse_configs
    from edgefuse.xnnpack.policy import DEFAULT_SINGLE_ROW_POLICY, SINGLE_ROW_POLICIES
    from edgefuse.xnnpack.quantizer import export_quantized, quantize
    from edgefuse.xnnpack.recipes import EdgefuseRecipeType
    from edgefuse.xnnpack.substitute import RestoreUndelegated, SubstituteForXnnpack


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
