"""ExecuTorch's LLM export and export recipes with edgefuse's XNNPACK lowering (and its QNN passes).

- :func:`export_llm`: ``export_llm`` of an ``LlmConfig`` with edgefuse's lowering;
  :func:`run_export_llm`: ExecuTorch's ``export_llm`` command line (hydra) in this process.
- :func:`edgefuse_lowering`: the context manager that swaps edgefuse's partitioners and passes into
  ExecuTorch's LLM export for a ``with`` block, and puts the released ones back after it.
- :func:`qnn_lowering`: the same for ``export_llm``'s QNN path: edgefuse's QNN passes in place of the
  stock ones, and a record of what QNN compiled.
- :class:`EdgefuseRecipeType`, :class:`EdgefuseRecipeProvider`: export recipes for
  ``executorch.export.export``, registered with ExecuTorch's recipe registry on import of
  :mod:`edgefuse.xnnpack.recipes`.
- :func:`read_pte`: the delegates and the kernels outside them in a ``.pte``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefuse.core.lazy import lazy_names

#: Each public name and the module that defines it.
_PUBLIC: dict[str, str] = {
    "ConfigRejected": "edgefuse.llm.export",
    "ExportFailed": "edgefuse.llm.export",
    "LlmExport": "edgefuse.llm.export",
    "QnnExportFailed": "edgefuse.llm.export",
    "export_llm": "edgefuse.llm.export",
    "run_export_llm": "edgefuse.llm.export",
    "LoweringSwapError": "edgefuse.llm.lowering",
    "edgefuse_lowering": "edgefuse.llm.lowering",
    "QnnRecord": "edgefuse.llm.qnn",
    "qnn_lowering": "edgefuse.llm.qnn",
    "PteContents": "edgefuse.llm.pte",
    "read_pte": "edgefuse.llm.pte",
    "check_method": "edgefuse.llm.static_llama",
    "parse_script_args": "edgefuse.llm.static_llama",
    "run_script": "edgefuse.llm.static_llama",
    "EdgefuseRecipeProvider": "edgefuse.xnnpack.recipes",
    "EdgefuseRecipeType": "edgefuse.xnnpack.recipes",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from edgefuse.llm.export import (
        ConfigRejected,
        ExportFailed,
        LlmExport,
        QnnExportFailed,
        export_llm,
        run_export_llm,
    )
    from edgefuse.llm.lowering import LoweringSwapError, edgefuse_lowering
    from edgefuse.llm.pte import PteContents, read_pte
    from edgefuse.llm.qnn import QnnRecord, qnn_lowering
    from edgefuse.llm.static_llama import check_method, parse_script_args, run_script
    from edgefuse.xnnpack.recipes import EdgefuseRecipeProvider, EdgefuseRecipeType


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
