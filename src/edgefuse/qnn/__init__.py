"""ExecuTorch's QNN backend with real QNN libraries: set up, loaded, and run on the x86 HTP emulator.

- :mod:`edgefuse.qnn.sdk`: where the QNN libraries are (:func:`find`), setting them up from a package
  registry (:func:`setup`), loading them into this process (:func:`ensure_in_process`).
- :mod:`edgefuse.qnn.emulator`: write a lowered program to a ``.pte`` and run it on the emulator.

Names are imported on first use (PEP 562), as in :mod:`edgefuse.xnnpack`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefuse.lazy import lazy_names

#: Each public name and the module that defines it.
_PUBLIC: dict[str, str] = {
    "Absent": "edgefuse.qnn.sdk",
    "QnnSdkUnavailable": "edgefuse.qnn.sdk",
    "Sdk": "edgefuse.qnn.sdk",
    "ensure_in_process": "edgefuse.qnn.sdk",
    "find": "edgefuse.qnn.sdk",
    "run_on_emulator": "edgefuse.qnn.emulator",
    "setup": "edgefuse.qnn.sdk",
    "to_pte": "edgefuse.qnn.emulator",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from edgefuse.qnn.emulator import run_on_emulator, to_pte
    from edgefuse.qnn.sdk import Absent, QnnSdkUnavailable, Sdk, ensure_in_process, find, setup


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
