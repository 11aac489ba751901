"""ExecuTorch's ``export_llm`` with edgefuse's XNNPACK lowering: the Python API and the command's engine.

- :func:`export_llm` takes an ``LlmConfig`` (what ``export_llama`` takes) and exports it with
  :func:`~edgefuse.llm.lowering.edgefuse_lowering` in force.
- :func:`run_export_llm` runs ExecuTorch's own ``export_llm`` entry point (hydra, ``--config FILE``,
  the same overrides, the same ``.pte`` and hydra run directory) in this process, with edgefuse's
  lowering (``lowering="edgefuse"``) or the released one (``"stock"``), and says which failures are the
  config's: :class:`ConfigRejected` carries export_llm's own message.

A config that lowers for QNN is refused with :class:`UnsupportedConfig` before anything is exported
(edgefuse's QNN pipeline is not wired into ``export_llm`` yet).
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from edgefuse.llm.lowering import Swap, atomic_pte_writes, edgefuse_lowering

EDGEFUSE = "edgefuse"
STOCK = "stock"
LOWERINGS = (EDGEFUSE, STOCK)

_ENTRY = ("executorch.extension.llm.export.export_llm", "export_llama")


class ConfigRejected(ValueError):
    """``export_llm`` rejected the config, an override, or the model it names, before any lowering;
    the message is the one ``export_llm`` prints."""


class UnsupportedConfig(ValueError):
    """The config asks for a lowering edgefuse does not put itself into yet."""


class ExportFailed(RuntimeError):
    """The export failed once edgefuse's partitioners or lowering were in use; ``__cause__`` is the error."""


@dataclass
class LlmExport:
    """One export: the ``.pte`` written (None if none was), and what the swap recorded."""

    path: str | None
    swap: Swap
    lowering: str = EDGEFUSE
    config: Any = None  # the LlmConfig export_llama ran with

    @property
    def edgefuse_lowered(self) -> bool:
        """Whether edgefuse's lowering ran (False for a config without XNNPACK, or for stock)."""
        return bool(self.swap.lowerings)


def _get(config, *path: str):
    for name in path:
        config = getattr(config, name, None)
    return config


def check_supported(config) -> None:
    """Raise :class:`UnsupportedConfig` for a config edgefuse cannot put its lowering into."""
    if _get(config, "backend", "qnn", "enabled"):
        raise UnsupportedConfig(
            "backend.qnn.enabled=True: edgefuse's QNN pipeline is not supported in export-llm yet; "
            "run ExecuTorch's export_llm for QNN, or lower for XNNPACK (backend.xnnpack.enabled=True)"
        )


def _xnnpack_enabled(config) -> bool:
    return bool(_get(config, "backend", "xnnpack", "enabled") or _get(config, "quantization", "pt2e_quantize"))


def _check_used(result: LlmExport) -> None:
    """An XNNPACK config exported without edgefuse's lowering means this ExecuTorch builds its partitioners
    elsewhere: remove the stock program written under edgefuse's name and say so."""
    if result.lowering != EDGEFUSE or result.edgefuse_lowered or not _xnnpack_enabled(result.config):
        return
    for path in result.swap.written:
        with contextlib.suppress(OSError):
            os.unlink(path)
    raise ExportFailed(
        "the config lowers for XNNPACK but export_llm did not use edgefuse's partitioners (this ExecuTorch "
        "builds them elsewhere than 1.5.1 does); no .pte was kept"
    )


def export_llm(config, *, single_row: str | None = None) -> LlmExport:
    """Export ``config`` (an ``LlmConfig`` or the ``DictConfig`` hydra makes of one) as ExecuTorch's
    ``export_llama`` does, with edgefuse's XNNPACK lowering; returns the ``.pte`` path and the record.

    ``config`` is not changed (``export_llama`` edits the config it is given, so it gets a copy).
    """
    from executorch.examples.models.llama import export_llama_lib

    check_supported(config)
    config = copy.deepcopy(config)
    with edgefuse_lowering(single_row) as swap:
        path = export_llama_lib.export_llama(config)
    result = LlmExport(path, swap, EDGEFUSE, config)
    _check_used(result)
    return result


def _entry(original, swap: Swap):
    """``export_llama`` as hydra's task calls it: check the config, keep it and the file it names."""

    def export_llama(config):
        check_supported(config)
        swap.config = config
        return original(config)

    export_llama.__wrapped__ = original
    return export_llama


@contextlib.contextmanager
def _argv_and_full_errors(argv: list[str]) -> Iterator[None]:
    """``sys.argv`` as export_llm's command line reads it, and hydra raising errors instead of exiting."""
    saved_argv, saved_env = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    sys.argv = argv
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        sys.argv = saved_argv
        if saved_env is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_env


def export_llm_message(error: BaseException) -> str:
    """What ``export_llm`` prints for ``error``: hydra's message and the config error under it, or the
    exception's type and message."""
    from hydra.errors import CompactHydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(error, CompactHydraException):
        lines = [str(error)]
        if isinstance(error.__cause__, OmegaConfBaseException):
            lines.append(str(error.__cause__))
        return "\n".join(lines)
    return f"{type(error).__name__}: {error}"


def run_export_llm(args: Sequence[str], *, lowering: str = EDGEFUSE, single_row: str | None = None) -> LlmExport:
    """Run ExecuTorch's ``export_llm`` command line (``[--config FILE] [OVERRIDES...]``) in this process.

    Raises :class:`ConfigRejected` with export_llm's message for anything that fails before a lowering
    with edgefuse's partitioners starts (an unknown override, a value the config rejects, a missing
    checkpoint, a model that does not export), :class:`UnsupportedConfig` for a QNN config, and
    :class:`ExportFailed` for a failure after edgefuse's lowering started. ``SystemExit`` (hydra's
    ``--help``, ``export.export_only``) passes through.
    """
    from executorch.extension.llm.export import export_llm as entry

    if lowering not in LOWERINGS:
        raise ValueError(f"lowering is one of {', '.join(LOWERINGS)}, got {lowering!r}")
    swaps = edgefuse_lowering(single_row) if lowering == EDGEFUSE else atomic_pte_writes()
    argv = [entry.__file__, *args]  # hydra names the job (and its log file) after the script
    with swaps as swap, _swapped_entry(swap), _argv_and_full_errors(argv):
        try:
            entry.main()
        except (UnsupportedConfig, SystemExit):
            raise
        except Exception as error:
            if swap.lowering_started:
                raise ExportFailed(f"export_llm failed in or after edgefuse's lowering: {export_llm_message(error)}") from error
            raise ConfigRejected(export_llm_message(error)) from error
    result = LlmExport(swap.written[-1] if swap.written else None, swap, lowering, swap.config)
    _check_used(result)
    return result


@contextlib.contextmanager
def _swapped_entry(swap: Swap) -> Iterator[None]:
    import importlib

    owner = importlib.import_module(_ENTRY[0])
    original = getattr(owner, _ENTRY[1])
    setattr(owner, _ENTRY[1], _entry(original, swap))
    try:
        yield
    finally:
        setattr(owner, _ENTRY[1], original)
