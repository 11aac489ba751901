"""Helpers for edge programs that hold a rebuilt ``rms_norm``."""

from __future__ import annotations

import torch
from executorch.exir import EdgeCompileConfig


def edge_compile_config(**kwargs) -> EdgeCompileConfig:
    """An ``EdgeCompileConfig`` whose verifier accepts ``aten.rms_norm``, which is not a core ATen op.

    Without it, ``EdgeProgramManager.transform([RecomposeRmsNorm()])`` fails the edge verifier. Pass it to
    both ``to_edge(..., compile_config=...)`` and ``transform(..., compile_config=...)``.
    """
    exceptions = list(kwargs.pop("_core_aten_ops_exception_list", []))
    if torch.ops.aten.rms_norm.default not in exceptions:
        exceptions.append(torch.ops.aten.rms_norm.default)
    return EdgeCompileConfig(_core_aten_ops_exception_list=exceptions, **kwargs)
