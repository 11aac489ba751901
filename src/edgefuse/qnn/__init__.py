"""ExecuTorch's QNN backend with real QNN libraries, and edgefuse inside its pipelines.

- :mod:`edgefuse.qnn.sdk`: where the QNN libraries are (:func:`find`), setting them up from a package
  registry (:func:`setup`), loading them into this process (:func:`ensure_in_process`).
- :mod:`edgefuse.qnn.emulator`: write a lowered program to a ``.pte`` and run it on the emulator.
- :func:`lower`: ExecuTorch's own QNN flow (``QnnQuantizer`` for the quantized precisions, then
  ``to_edge_transform_and_lower_to_qnn``) with edgefuse's passes in place of the stock ones; returns a
  :class:`QnnLowered`, whose ``graphs`` say what QNN built (:mod:`edgefuse.qnn.graphs`).
- :func:`patched`: the same swap around a user's own QNN script, restored on exit.

Names are imported on first use (PEP 562), as in :mod:`edgefuse.xnnpack`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefuse.core.lazy import lazy_names

#: Each public name and the module that defines it.
_PUBLIC: dict[str, str] = {
    "Absent": "edgefuse.qnn.sdk",
    "LOWER_PRECISIONS": "edgefuse.qnn.pipeline",
    "PassRun": "edgefuse.qnn.passes",
    "QnnLibrariesMissing": "edgefuse.qnn.pipeline",
    "QnnLowered": "edgefuse.qnn.pipeline",
    "QnnLoweringFailed": "edgefuse.qnn.pipeline",
    "QnnPatch": "edgefuse.qnn.passes",
    "QnnRecomposeRmsNorm": "edgefuse.qnn.passes",
    "QnnRemoveRedundancy": "edgefuse.qnn.passes",
    "QnnSdkUnavailable": "edgefuse.qnn.sdk",
    "Sdk": "edgefuse.qnn.sdk",
    "ensure_in_process": "edgefuse.qnn.sdk",
    "find": "edgefuse.qnn.sdk",
    "lower": "edgefuse.qnn.pipeline",
    "patched": "edgefuse.qnn.passes",
    "quantize_for_qnn": "edgefuse.qnn.quantizer",
    "run_on_emulator": "edgefuse.qnn.emulator",
    "setup": "edgefuse.qnn.sdk",
    "to_pte": "edgefuse.qnn.emulator",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from edgefuse.qnn.emulator import run_on_emulator, to_pte
    from edgefuse.qnn.passes import PassRun, QnnPatch, QnnRecomposeRmsNorm, QnnRemoveRedundancy, patched
    from edgefuse.qnn.pipeline import LOWER_PRECISIONS, QnnLibrariesMissing, QnnLowered, QnnLoweringFailed, lower
    from edgefuse.qnn.quantizer import quantize_for_qnn
    from edgefuse.qnn.sdk import Absent, QnnSdkUnavailable, Sdk, ensure_in_process, find, setup


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
