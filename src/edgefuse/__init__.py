"""edgefuse: rebuild decomposed RMSNorm for ExecuTorch backends without moving a rounding.

The public names below are imported on first use (PEP 562): ``import edgefuse`` loads neither torch nor
ExecuTorch, so the ``edgefuse`` command answers ``--help`` and usage errors at once, while
``edgefuse.recompose_rms_norm`` and ``from edgefuse import edge_compile_config`` work as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefuse.core.lazy import lazy_names

#: Each public name and the module that defines it.
_PUBLIC: dict[str, str] = {
    "PROFILES": "edgefuse.core.profiles",
    "BackendProfile": "edgefuse.core.profiles",
    "get_profile": "edgefuse.core.profiles",
    "Decision": "edgefuse.core.recompose",
    "RecomposeResult": "edgefuse.core.recompose",
    "recompose_rms_norm": "edgefuse.core.recompose",
    "remove_redundant_casts": "edgefuse.core.redundant_casts",
    "edge_compile_config": "edgefuse.core.edge",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from edgefuse.core.edge import edge_compile_config
    from edgefuse.core.profiles import PROFILES, BackendProfile, get_profile
    from edgefuse.core.recompose import Decision, RecomposeResult, recompose_rms_norm
    from edgefuse.core.redundant_casts import remove_redundant_casts


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
