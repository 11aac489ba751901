"""What the application reads: a MODEL named on the command line (a built-in model, a ``file.py:function``,
a ``.pt2`` read as data within bounds), and the errors a person can act on when it is wrong.

The public names are the built-in tiny models' builders, imported on first use as in :mod:`edgefuse`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefuse.core.lazy import lazy_names

#: Each public name and the module that defines it: the built-in tiny models, imported on first use.
_PUBLIC: dict[str, str] = {
    "build_model": "edgefuse.inputs.models",
    "build_qnn_model": "edgefuse.inputs.qnn_models",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from edgefuse.inputs.models import build_model
    from edgefuse.inputs.qnn_models import build_qnn_model


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
