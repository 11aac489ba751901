"""edgefuse: rebuild decomposed RMSNorm for ExecuTorch backends without moving a rounding.

The public names below are imported on first use (PEP 562): ``import edgefuse`` loads neither torch nor
ExecuTorch, so the ``edgefuse`` command answers ``--help`` and usage errors at once, while
``edgefuse.recompose_rms_norm`` and ``from edgefuse import edge_compile_config`` work as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the module that defines it.
_PUBLIC: dict[str, str] = {
    "PROFILES": "edgefuse.profiles",
    "BackendProfile": "edgefuse.profiles",
    "get_profile": "edgefuse.profiles",
    "Decision": "edgefuse.recompose",
    "RecomposeResult": "edgefuse.recompose",
    "recompose_rms_norm": "edgefuse.recompose",
    "remove_redundant_casts": "edgefuse.redundant_casts",
    "edge_compile_config": "edgefuse.edge",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from edgefuse.edge import edge_compile_config
    from edgefuse.profiles import PROFILES, BackendProfile, get_profile
    from edgefuse.recompose import Decision, RecomposeResult, recompose_rms_norm
    from edgefuse.redundant_casts import remove_redundant_casts


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'edgefuse' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
