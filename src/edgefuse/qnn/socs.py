"""The Qualcomm SoCs ExecuTorch's QNN backend compiles for and the HTP generation of each, read from
ExecuTorch's own tables without importing torch, so a command can refuse an unknown ``--soc`` (or a
precision QNN does not compile for it) before any slow work; and the ``qnn`` profile of a SoC's generation."""

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


def htp_arch(soc: str) -> str | None:
    """The HTP generation (``V75``) of ``soc`` in ExecuTorch's SoC table, or None when it has none."""
    try:
        from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset, _soc_info_table
    except Exception:  # noqa: BLE001  (an installation without the Qualcomm backend)
        return None
    info = _soc_info_table.get(QcomChipset[soc]) if soc in QcomChipset.__members__ else None
    return info.htp_info.htp_arch.name if info is not None else None


def qnn_profile(soc: str | None):
    """The ``qnn`` profile holding the limits measured on the HTP generation of ``soc``, and a sentence
    saying which: a generation not measured (or no SoC) is held to every limit measured on any."""
    from edgefuse.core.profiles import get_profile

    profile = get_profile("qnn")
    arch = htp_arch(soc) if soc is not None else None
    generation = profile.generation(arch)
    if generation is not None:
        return profile.for_generation(arch), f"the limits of {arch}, measured on {', '.join(generation.chips)}"
    measured = ", ".join(g.name for g in profile.generations)
    what = f"{soc}'s HTP generation {arch or '(unknown)'} was not measured" if soc else "no SoC given"
    return profile, f"{what}: every limit measured on {measured}"


def soc_problem(soc: str, precision: str) -> str | None:
    """Why edgefuse does not lower for ``soc`` at ``precision`` (``fp16`` or a quantized one): a SoC
    ExecuTorch's QNN backend does not know, or a precision QNN was measured not to compile for it; None
    when it may."""
    known = qnn_socs()
    if known and soc not in known:
        return f"--soc {soc}: ExecuTorch's QNN backend knows {', '.join(known)}"
    from edgefuse.core.profiles import FLOAT, QUANTIZED, get_profile

    refusal = get_profile("qnn").refusal(soc, FLOAT if precision == "fp16" else QUANTIZED)
    return f"--soc {soc} at {precision}: {refusal.measured}; choose a quantized precision" if refusal else None


def limits_by_soc() -> list[tuple[str, str, str, str, str]]:
    """One row per SoC ExecuTorch knows: its name, its HTP generation, whether QNN compiles a float16 norm
    for it (or why not), the limits edgefuse holds its norms to (the profile's for its generation), and
    the chip of that generation they were measured on, with the limits measured there."""
    from edgefuse.core.profiles import FLOAT, get_profile

    qnn = get_profile("qnn")
    rows = []
    for soc in qnn_socs():
        arch = htp_arch(soc)
        refusal = qnn.refusal(soc, FLOAT)
        fp16 = "yes" if refusal is None else f"no: {refusal.why}"
        generation = qnn.generation(arch)
        names = ", ".join(limit.name for limit in qnn.for_generation(arch).limits)
        where = f"{', '.join(generation.chips)}: {', '.join(sorted(generation.measured))}" if generation else "-"
        rows.append((soc, arch or "-", fp16, names, where))
    return rows
