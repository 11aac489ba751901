"""Hugging Face's export flow (optimum-executorch) with edgefuse's XNNPACK lowering.

- :func:`export`: optimum-executorch's ``main_export`` of a model saved with ``save_pretrained``, with the
  ``edgefuse-xnnpack`` recipe (or stock's ``xnnpack``), each request checked before anything slow runs.
- :func:`register`: registers ``edgefuse-xnnpack`` with optimum-executorch's recipe registry, for a caller
  that runs optimum's own ``main_export``.
- :data:`OPTIONS`, :data:`RECIPES`: what an export may ask for; :class:`HfInputError`,
  :class:`OptimumUnavailable`, :class:`ModelRejected`: why it refuses.

Importing this package imports neither optimum, torch nor ExecuTorch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefuse.core.lazy import lazy_names

#: Each public name and the module that defines it.
_PUBLIC: dict[str, str] = {
    "EDGEFUSE_RECIPE": "edgefuse.hf.options",
    "HfInputError": "edgefuse.hf.options",
    "OPTIONS": "edgefuse.hf.options",
    "RECIPES": "edgefuse.hf.options",
    "STOCK_RECIPE": "edgefuse.hf.options",
    "HfExport": "edgefuse.hf.flow",
    "ModelRejected": "edgefuse.hf.flow",
    "OptimumUnavailable": "edgefuse.hf.flow",
    "export": "edgefuse.hf.flow",
    "RecipeRecord": "edgefuse.hf.recipe",
    "register": "edgefuse.hf.recipe",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from edgefuse.hf.flow import HfExport, ModelRejected, OptimumUnavailable, export
    from edgefuse.hf.options import EDGEFUSE_RECIPE, OPTIONS, RECIPES, STOCK_RECIPE, HfInputError
    from edgefuse.hf.recipe import RecipeRecord, register


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
