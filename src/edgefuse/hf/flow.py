"""Hugging Face's export flow with edgefuse: optimum-executorch's ``main_export`` with a recipe, from Python.

:func:`export` checks what it is asked (:mod:`edgefuse.hf.options`: the model folder, the recipe, the options,
the output) and that optimum-executorch is installed before it imports torch or loads the model, then
registers ``edgefuse-xnnpack`` (:func:`edgefuse.hf.recipe.register`) and runs optimum's export for the
``text-generation`` task. optimum writes its program in a private folder inside the output folder, and the
program is then written to its name there as a new file (:func:`edgefuse.runtime.files.write_new`), so an
export never writes over a file, nor through a link. A failure before optimum has loaded the model is the
model's or the options' (:class:`ModelRejected`); one after it is the lowering's and is raised as it is.
An output folder the export made is removed when it fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from edgefuse.hf.options import (
    EDGEFUSE_RECIPE,
    PROGRAM_NAME,
    TASK,
    HfInputError,
    check_model_folder,
    check_options,
    check_recipe,
)
from edgefuse.runtime.files import why_unwritable, write_new

#: The line that installs what the flow needs, for the error that says it is missing.
INSTALL = "pip install optimum-executorch"


class OptimumUnavailable(ImportError):
    """optimum-executorch is not installed; the message says how to install it."""


class ModelRejected(ValueError):
    """optimum could not load or prepare the model with the options given (before any lowering); the
    message is optimum's or transformers'."""


@dataclass
class HfExport:
    """One export: the program written, the recipe and options it ran with, its model type, its wall time,
    and for ``edgefuse-xnnpack`` what edgefuse's lowering substituted and restored."""

    path: str
    recipe: str
    options: dict
    model_type: str
    seconds: float
    record: object = field(default=None)  # edgefuse.hf.recipe.RecipeRecord, for edgefuse's recipe


def check_export(model_dir, output_dir, recipe: str = EDGEFUSE_RECIPE, name: str = PROGRAM_NAME,
                 **options) -> tuple[str, dict]:
    """Everything :func:`export` refuses before it imports torch: the recipe, the options, the model folder
    (its ``model_type`` is returned with the checked options) and a program already at ``output_dir/name``."""
    check_recipe(recipe)
    checked = check_options(options)
    model_type = check_model_folder(model_dir)
    if os.path.basename(name) != name or not name.endswith(".pte"):
        raise HfInputError(f"the program's name {name!r} is a file name ending in .pte, without a folder")
    target = os.path.join(os.fspath(output_dir), name)
    if os.path.lexists(target):
        raise HfInputError(f"{target} is already there: the export writes a new file only; remove it or choose "
                           "another output folder")
    if os.path.lexists(output_dir) and not os.path.isdir(output_dir):
        raise HfInputError(f"the output {os.fspath(output_dir)} is not a folder")
    reason = why_unwritable(output_dir, folder=True)
    if reason is not None:
        raise HfInputError(f"cannot write the output folder {os.fspath(output_dir)}: {reason}")
    return model_type, checked


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it (a missing parent package counts as
    not installed)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_installed(options: dict) -> None:
    """:class:`OptimumUnavailable` unless optimum-executorch can be imported; :class:`HfInputError` for the
    custom KV cache with a transformers that optimum-executorch 1.1.0's cache cannot import."""
    if not installed("optimum.exporters.executorch"):
        raise OptimumUnavailable(f"optimum-executorch is not installed: {INSTALL}")
    if options.get("use_custom_kv_cache"):
        import transformers
        import transformers.cache_utils

        if not hasattr(transformers.cache_utils, "HybridCache"):
            raise HfInputError(
                f"use_custom_kv_cache: optimum-executorch's custom KV cache imports transformers' HybridCache, which "
                f"transformers {transformers.__version__} no longer has (5.0.0rc1, the version optimum-executorch "
                "1.1.0 pins, has it); export without it"
            )


def export(model_dir, output_dir, recipe: str = EDGEFUSE_RECIPE, *, name: str = PROGRAM_NAME,
           **options) -> HfExport:
    """Export the Hugging Face model saved in ``model_dir`` with optimum-executorch's ``main_export`` and
    ``recipe`` (``edgefuse-xnnpack`` or stock's ``xnnpack``) to ``output_dir/name``, for the
    ``text-generation`` task with optimum's ``options`` (``use_custom_sdpa=True``, ``qlinear="8da4w"``,
    ``dtype="bfloat16"``, ...: :data:`edgefuse.hf.options.OPTIONS`).

    Raises :class:`~edgefuse.hf.options.HfInputError` for what it is asked, :class:`OptimumUnavailable`,
    and :class:`ModelRejected` when optimum cannot load the model; all before anything is lowered."""
    model_type, checked = check_export(model_dir, output_dir, recipe, name, **options)
    check_installed(checked)
    made = not os.path.lexists(output_dir)
    try:  # before optimum and torch load: a folder that cannot be made fails in a moment, not after them
        os.makedirs(output_dir, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".edgefuse-hf-", dir=output_dir)
    except OSError as error:
        raise HfInputError(f"cannot write the output folder {os.fspath(output_dir)}: {error.strerror}") from error
    try:
        return _export_in(model_dir, output_dir, staging, recipe, name, model_type, checked)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if made:  # the folder this run made goes when it holds nothing, as after a failure
            with contextlib.suppress(OSError):
                os.rmdir(output_dir)


def _export_in(model_dir, output_dir, staging: str, recipe: str, name: str, model_type: str,
               checked: dict) -> HfExport:
    """:func:`export` once its folders are made: optimum writes in ``staging``, and its program is written
    to ``output_dir/name`` as a new file. A failure before optimum has made its output folder, which it
    makes once the model is loaded, is :class:`ModelRejected`."""
    from optimum.exporters.executorch import main_export

    from edgefuse.hf.recipe import RecipeRecord, register

    register()
    record = RecipeRecord() if recipe == EDGEFUSE_RECIPE else None
    written = os.path.join(staging, "out")  # optimum makes it once the model is loaded
    start = time.perf_counter()
    try:
        main_export(os.fspath(model_dir), task=TASK, recipe=recipe, output_dir=written,
                    recipe_kwargs={} if record is None else {"record": record}, **checked)
    except Exception as error:
        if not os.path.isdir(written):
            raise ModelRejected(f"optimum could not load {os.fspath(model_dir)} ({model_type}) for {TASK}: "
                                f"{type(error).__name__}: {error}") from error
        raise
    seconds = time.perf_counter() - start
    target = os.path.join(os.fspath(output_dir), name)
    try:
        with open(os.path.join(written, PROGRAM_NAME), "rb") as program:
            write_new(target, program)
    except FileExistsError as error:
        raise HfInputError(f"{target} appeared while the model was exported; it was left as it is") from error
    return HfExport(target, recipe, checked, model_type, seconds, record)
