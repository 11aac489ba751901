"""The Qualcomm SoCs ExecuTorch's QNN backend compiles for, read without importing torch, so a command
can refuse an unknown ``--soc`` before any slow work."""

from __future__ import annotations


def qnn_socs() -> list[str]:
    """The SoC names of the pinned ExecuTorch's QNN backend (``QcomChipset``), sorted, without its
    ``UNKNOWN_SM`` placeholder (no SoC to compile for); [] when its Qualcomm package is missing (the
    lowering then says why)."""
    try:
        from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    except Exception:  # noqa: BLE001  (an installation without the Qualcomm backend)
        return []
    return sorted(c.name for c in QcomChipset if c.value != 0)
