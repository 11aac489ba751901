"""edgefuse: rebuild decomposed RMSNorm for ExecuTorch backends without moving a rounding."""

from edgefuse.edge import edge_compile_config
from edgefuse.profiles import PROFILES, BackendProfile, get_profile
from edgefuse.recompose import Decision, RecomposeResult, recompose_rms_norm
from edgefuse.redundant_casts import remove_redundant_casts

__all__ = [
    "PROFILES",
    "BackendProfile",
    "Decision",
    "RecomposeResult",
    "edge_compile_config",
    "get_profile",
    "recompose_rms_norm",
    "remove_redundant_casts",
]
