"""ExecuTorch's ``export_llm`` with edgefuse's XNNPACK lowering: the Python API and the command's engine.

- :func:`export_llm` takes an ``LlmConfig`` (what ``export_llama`` takes) and exports it with
  :func:`~edgefuse.llm.lowering.edgefuse_lowering` in force.
- :func:`run_export_llm` runs ExecuTorch's own ``export_llm`` entry point (hydra, ``--config FILE``,
  the same overrides, the same ``.pte``) in this process, with edgefuse's lowering
  (``lowering="edgefuse"``) or the released one (``"stock"``), once the config and overrides are checked
  as data (:mod:`edgefuse.llm.config_check`), with hydra's run folder where edgefuse puts it; it says
  which failures are the config's: :class:`ConfigRejected` carries export_llm's own message.

A config that lowers for QNN (``backend.qnn.enabled=True``) runs export_llm's own QNN path with
edgefuse's QNN passes in place of the stock ones (:func:`edgefuse.llm.qnn.qnn_lowering`); the result's
``swap.qnn`` says what QNN compiled.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from edgefuse.llm.config import is_qnn_config, output_folder, output_problem, soc_problem, xnnpack_enabled
from edgefuse.llm.lowering import Swap, atomic_pte_writes, edgefuse_lowering

EDGEFUSE = "edgefuse"
STOCK = "stock"
LOWERINGS = (EDGEFUSE, STOCK)

_ENTRY = ("executorch.extension.llm.export.export_llm", "export_llama")


class ConfigRejected(ValueError):
    """``export_llm`` rejected the config, an override, or the model it names, before any lowering;
    the message is the one ``export_llm`` prints."""


class ExportFailed(RuntimeError):
    """The export failed once edgefuse's partitioners or lowering were in use; ``__cause__`` is the error."""


class QnnExportFailed(ValueError):
    """export_llm's QNN lowering failed in ExecuTorch's or QNN's code (not in edgefuse's): the model or
    config is one QNN cannot lower; the message carries the reason."""


@dataclass
class LlmExport:
    """One export: the ``.pte`` written (None if none was), and what the swap recorded."""

    path: str | None
    swap: Swap
    lowering: str = EDGEFUSE
    config: Any = None  # the LlmConfig export_llama ran with

    @property
    def edgefuse_lowered(self) -> bool:
        """Whether edgefuse's lowering ran: its XNNPACK lowering, or its QNN passes (False for a config
        that lowers for neither, or for stock)."""
        if self.swap.qnn is not None:
            return self.lowering == EDGEFUSE and bool(self.swap.qnn.patch and self.swap.qnn.patch.runs)
        return bool(self.swap.lowerings)


def check_supported(config) -> None:
    """Raise :class:`ConfigRejected` for a config export_llm fails on only after the whole export: an
    output path it cannot write, or a QNN config whose SoC QNN does not know (a bare ``AttributeError``)."""
    problem = output_problem(config) or (soc_problem(config) if is_qnn_config(config) else None)
    if problem:
        raise ConfigRejected(problem)


def lowering_for(config, lowering: str = EDGEFUSE, single_row: str | None = None):
    """The swap that exports ``config`` with ``lowering``: the QNN one for a config export_llama lowers
    for QNN, else the XNNPACK one (edgefuse's, or stock's with only the atomic writer). A single-row
    policy for a QNN config is :class:`ConfigRejected`: QNN's passes have no such choice to make."""
    from edgefuse.llm.qnn import qnn_lowering

    if is_qnn_config(config):
        if single_row is not None:
            raise ConfigRejected(
                f"single-row policy {single_row!r}: it is for edgefuse's XNNPACK lowering, and this is a QNN "
                "config (backend.qnn.enabled=True); leave the policy out"
            )
        return qnn_lowering(lowering)
    return edgefuse_lowering(single_row) if lowering == EDGEFUSE else atomic_pte_writes()


def _check_used(result: LlmExport) -> None:
    """An XNNPACK config exported without edgefuse's lowering, or a QNN config whose QNN lowering was not
    the one swapped into, means this ExecuTorch lowers elsewhere than 1.5.1 does: remove the program
    written under edgefuse's name and say so."""
    qnn = result.swap.qnn
    if qnn is not None:
        if qnn.builder is not None and (result.lowering != EDGEFUSE or result.edgefuse_lowered):
            return
        what = "QNN lowering" if qnn.builder is None else "QNN pass lists"
    elif result.lowering != EDGEFUSE or result.edgefuse_lowered or not xnnpack_enabled(result.config):
        return
    else:
        what = "partitioners"
    for path in result.swap.written:
        with contextlib.suppress(OSError):
            os.unlink(path)
    backend = "QNN" if qnn is not None else "XNNPACK"
    raise ExportFailed(
        f"the config lowers for {backend} but export_llm did not use the {what} edgefuse swaps into (this "
        "ExecuTorch builds them elsewhere than 1.5.1 does); no .pte was kept"
    )


def export_llm(config, *, single_row: str | None = None) -> LlmExport:
    """Export ``config`` (an ``LlmConfig`` or the ``DictConfig`` hydra makes of one) as ExecuTorch's
    ``export_llama`` does, with edgefuse's XNNPACK lowering, or edgefuse's QNN passes for a QNN config;
    returns the ``.pte`` path and the record.

    ``config`` is not changed (``export_llama`` edits the config it is given, so it gets a copy).
    """
    from executorch.examples.models.llama import export_llama_lib

    check_supported(config)
    config = copy.deepcopy(config)
    with lowering_for(config, EDGEFUSE, single_row) as swap:
        path = export_llama_lib.export_llama(config)
    result = LlmExport(path, swap, EDGEFUSE, config)
    _check_used(result)
    return result


def _entry(original, exports: list[Swap], lowering: str, single_row: str | None):
    """``export_llama`` as hydra's task calls it: check the config, export it inside the swap its backend
    needs (appended to ``exports``), keep the config."""

    def export_llama(config):
        check_supported(config)
        with lowering_for(config, lowering, single_row) as swap:
            exports.append(swap)
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


def run_export_llm(args: Sequence[str], *, lowering: str = EDGEFUSE, single_row: str | None = None,
                   hydra_dir: str | None = None) -> LlmExport:
    """Run ExecuTorch's ``export_llm`` command line (``[--config FILE] [OVERRIDES...]``) in this process.

    The config and the overrides are checked as data first (:mod:`edgefuse.llm.config_check`), and hydra
    reads the checked bytes of the config from a new private folder, never the file again. Hydra's run
    folder (its ``.hydra`` record and ``export_llm.log``) is ``hydra_dir``, else the ``.pte``'s folder.

    Raises :class:`~edgefuse.llm.config_check.ConfigRefused` naming a key or override that is more than
    data, :class:`ConfigRejected` with export_llm's message for anything that fails before a lowering
    with edgefuse's code starts (a value the config rejects, an output folder that does not exist, a
    missing checkpoint, a model that does not export, a SoC QNN does not know), :class:`QnnExportFailed`
    with the reason for a QNN lowering that fails in ExecuTorch's or QNN's code, :class:`ExportFailed` for
    any other failure after the lowering started, and :class:`edgefuse.qnn.QnnSdkUnavailable` for a QNN
    config without the QNN libraries. ``SystemExit`` (``export.export_only``) passes through.
    """
    from omegaconf.errors import OmegaConfBaseException

    from edgefuse.llm.config_check import check_command_line, run_folder_override

    if lowering not in LOWERINGS:
        raise ValueError(f"lowering is one of {', '.join(LOWERINGS)}, got {lowering!r}")
    command = check_command_line(args)
    try:
        config = command.composed()
        problem, folder = output_problem(config), output_folder(config)
    except OmegaConfBaseException as error:
        raise ConfigRejected(export_llm_message(error)) from error
    if problem:
        raise ConfigRejected(problem)
    run_folder = run_folder_override(folder if hydra_dir is None else hydra_dir)
    with _config_for_hydra(command.config) as config_args:
        return _run_entry([*config_args, *command.overrides, run_folder], lowering, single_row)


@contextlib.contextmanager
def _config_for_hydra(config: bytes | None) -> Iterator[list[str]]:
    """``--config COPY`` for the checked bytes ``config``: a file in a new private folder, the only folder
    hydra then searches for configs, removed once the export ends."""
    from edgefuse.runtime.files import fresh_private_folder, write_new

    if config is None:
        yield []
        return
    folder = fresh_private_folder("edgefuse-config-")
    try:
        path = os.path.join(folder, "config.yaml")
        write_new(path, config)
        yield ["--config", path]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_entry(args: list[str], lowering: str, single_row: str | None) -> LlmExport:
    """export_llm's entry point on ``args`` (checked), with the swap ``lowering`` needs; see
    :func:`run_export_llm` for what it raises."""
    from executorch.extension.llm.export import export_llm as entry

    from edgefuse.qnn.pipeline import failure_reason, raised_in_edgefuse
    from edgefuse.qnn.sdk import QnnSdkUnavailable

    exports: list[Swap] = []
    argv = [entry.__file__, *args]  # hydra names the job (and its log file) after the script
    with _swapped_entry(exports, lowering, single_row), _argv_and_full_errors(argv):
        try:
            entry.main()
        except (ConfigRejected, QnnSdkUnavailable, SystemExit):
            raise
        except Exception as error:
            swap = exports[-1] if exports else None
            if swap is None or not swap.lowering_started:
                raise ConfigRejected(export_llm_message(error)) from error
            if swap.qnn is not None and not raised_in_edgefuse(error):
                raise QnnExportFailed(f"export_llm's QNN lowering failed: {failure_reason(error)}") from error
            raise ExportFailed(f"export_llm failed in or after edgefuse's lowering: {export_llm_message(error)}") from error
    if not exports:
        raise ExportFailed("export_llm returned without calling export_llama; no .pte was written")
    swap = exports[-1]
    result = LlmExport(swap.written[-1] if swap.written else None, swap, lowering, swap.config)
    _check_used(result)
    return result


@contextlib.contextmanager
def _swapped_entry(exports: list[Swap], lowering: str, single_row: str | None) -> Iterator[None]:
    import importlib

    owner = importlib.import_module(_ENTRY[0])
    original = getattr(owner, _ENTRY[1])
    setattr(owner, _ENTRY[1], _entry(original, exports, lowering, single_row))
    try:
        yield
    finally:
        setattr(owner, _ENTRY[1], original)
