"""What an ``LlmConfig`` asks ExecuTorch's ``export_llm`` for, read from its settings: where the ``.pte``
goes, and which backend lowers it. A leaf: the export and the QNN path both read it, neither the other."""

from __future__ import annotations

import os


def setting(config, *path: str):
    """The setting at ``path`` of an ``LlmConfig`` (or of the ``DictConfig`` hydra makes of one), None where
    it has none."""
    for name in path:
        config = getattr(config, name, None)
    return config


def _output(config) -> tuple[str | None, str, str]:
    """Where export_llm writes the ``.pte`` of ``config``: its path (None when export_llm names it after the
    model), its folder, and the settings that say so. The path is ``export.output_name`` as given when it
    ends in ``.pte``, else ``export.output_dir/NAME.pte``."""
    folder = str(setting(config, "export", "output_dir") or ".")
    name = setting(config, "export", "output_name")
    if not name:
        return None, folder, f"export.output_dir={folder}"
    if str(name).endswith(".pte"):
        return str(name), os.path.dirname(str(name)) or ".", f"export.output_name={name}"
    path = os.path.join(folder, f"{name}.pte")
    return path, os.path.dirname(path) or ".", f"export.output_name={name} (in export.output_dir={folder})"


def output_folder(config) -> str:
    """The folder export_llm writes the ``.pte`` of ``config`` in."""
    return _output(config)[1]


def output_problem(config) -> str | None:
    """Why export_llm could not write the ``.pte`` of ``config`` (its folder missing, or the path a
    directory), or None."""
    path, folder, what = _output(config)
    if path is not None and os.path.isdir(path):
        return f"{what}: {path} is a directory; name the .pte file to write"
    if not os.path.isdir(folder):
        return f"{what}: the folder {folder} does not exist"
    return None


def xnnpack_enabled(config) -> bool:
    """Whether ``export_llama`` lowers ``config`` for XNNPACK: the backend on, or a PT2E quantization of
    XNNPACK's (which turns it on)."""
    options = setting(config, "quantization", "pt2e_quantize")
    options = str(getattr(options, "value", options) or "").split(",")
    return bool(setting(config, "backend", "xnnpack", "enabled")) or any(o.strip().startswith("xnnpack") for o in options)


def is_qnn_config(config) -> bool:
    """Whether ``export_llama`` lowers ``config`` through its QNN path: QNN on, and no XNNPACK lowering
    (with both on, 1.5.1 lowers for XNNPACK alone)."""
    return bool(setting(config, "backend", "qnn", "enabled")) and not xnnpack_enabled(config)


def soc_problem(config) -> str | None:
    """Why ``backend.qnn.soc_model`` names no SoC QNN knows (1.5.1 fails on it with a bare
    ``AttributeError`` after the export), or None."""
    from edgefuse.qnn.socs import qnn_socs

    soc, known = setting(config, "backend", "qnn", "soc_model"), qnn_socs()
    if str(soc) in known or not known:  # none known: the Qualcomm package is missing, and the export says so
        return None
    return f"backend.qnn.soc_model={soc}: not a SoC QNN knows ({', '.join(known)})"
