"""edgefuse's XNNPACK lowering inside ExecuTorch's LLM export, swapped in for a block and restored after it.

ExecuTorch's ``export_llm`` (``executorch.examples.models.llama.export_llama_lib``) builds its XNNPACK
partitioners with ``partitioner_lib.get_xnnpack_partitioner`` (the dynamic-quantization one first, then
the full one with ``extended_ops``) and lowers with ``to_edge_transform_and_lower``, both looked up as
module attributes when an export runs. :func:`edgefuse_lowering` replaces them for the duration of a
``with`` block:

- every XNNPACK partitioner the flow builds is an
  :class:`~edgefuse.xnnpack.EdgefuseXnnpackPartitioner` with the same options (the dynamically
  quantized one keeps ``config_precisions=DYNAMIC_QUANT``);
- a lowering given one of them runs :class:`~edgefuse.xnnpack.SubstituteForXnnpack` before
  partitioning and :class:`~edgefuse.xnnpack.RestoreUndelegated` after it, on every method, and then
  frees the constants the replaced programs held (:func:`~edgefuse.xnnpack.lowering.restore_undelegated`);
- the ``.pte`` is written to a temporary file beside its destination and moved into place, so a
  failed write leaves no partial file (the released writer logs the error and keeps the partial file).

Everything is put back when the block exits, also when it raises. The block records each lowering it
ran (:class:`Lowering`), so a caller can tell that edgefuse's lowering was the one used.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

#: The module attributes swapped, as ``(module, attribute)``; each holds the released function.
PARTITIONER_FACTORIES = (
    ("executorch.extension.llm.export.partitioner_lib", "get_xnnpack_partitioner"),
    ("executorch.examples.models.llama.export_llama_lib", "get_xnnpack_partitioner"),
)
LOWERINGS = (
    ("executorch.extension.llm.export.builder", "to_edge_transform_and_lower"),
    ("executorch.examples.models.llama.export_llama_lib", "to_edge_transform_and_lower"),
)
WRITERS = (("executorch.extension.llm.export.builder", "save_pte_program"),)

#: The parameters of the released ``get_xnnpack_partitioner`` (ExecuTorch 1.5.1) the swap reproduces.
_FACTORY_PARAMETERS = ("dynamic_quant_only_partitioner", "enable_bf16")

_active = threading.Lock()


def _released_lowering_signature(programs, transform_passes=None, partitioner=None, constant_methods=None,
                                 compile_config=None, generate_etrecord=False):
    """The parameters of ExecuTorch 1.5.1's ``to_edge_transform_and_lower``, which its logging decorator
    hides behind ``(*args, **kwargs)``."""


_LOWERING_SIGNATURE = inspect.signature(_released_lowering_signature)


class LoweringSwapError(RuntimeError):
    """The installed ExecuTorch's LLM export is not the one edgefuse swaps into (or a swap is active)."""


@dataclass
class Lowering:
    """One ``to_edge_transform_and_lower`` call that ran with edgefuse's partitioners."""

    partitioners: list[str]
    substituted: int = 0  # means, casts, scalar adds and tanh GELUs swapped for edgefuse's ops before partitioning
    restored: int = 0  # of those, the ones left outside a delegate and put back after it
    manager: Any = None  # the lowered EdgeProgramManager


@dataclass
class Swap:
    """What a :func:`edgefuse_lowering` block did: the partitioners it built, the lowerings it ran, and
    the ``.pte`` files written (by :func:`atomic_pte_writes`, which it includes)."""

    single_row: str | None = None
    lowerings: list[Lowering] = field(default_factory=list)
    partitioners_built: int = 0
    #: Set when edgefuse's code first runs in the export (a partitioner built, a lowering begun): a
    #: failure before it is the config's or the model's, one after it may be edgefuse's.
    lowering_started: bool = False
    written: list[str] = field(default_factory=list)
    config: Any = None  # the config export_llm ran with, when the command line's entry point was used
    qnn: Any = None  # edgefuse.llm.qnn.QnnRecord, for an export lowered for QNN


def _resolve(module: str, name: str) -> tuple[Any, Callable]:
    try:
        owner = importlib.import_module(module)
    except ImportError as error:
        raise LoweringSwapError(f"cannot import {module} ({error}): ExecuTorch's LLM export is not installed") from error
    if not hasattr(owner, name):
        raise LoweringSwapError(f"{module} has no {name}: edgefuse swaps into ExecuTorch 1.5.1's LLM export")
    return owner, getattr(owner, name)


def _partitioner_factory(original: Callable, swap: Swap) -> Callable:
    """``get_xnnpack_partitioner`` building edgefuse's partitioner with the released options."""
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType

    from edgefuse.xnnpack.partitioner import EdgefuseXnnpackPartitioner

    parameters = tuple(inspect.signature(original).parameters)
    if parameters != _FACTORY_PARAMETERS:
        raise LoweringSwapError(
            f"get_xnnpack_partitioner takes ({', '.join(parameters)}); edgefuse reproduces ExecuTorch 1.5.1's "
            f"({', '.join(_FACTORY_PARAMETERS)})"
        )
    signature = inspect.signature(original)

    def get_xnnpack_partitioner(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        options = dict(bound.arguments)
        swap.lowering_started = True
        swap.partitioners_built += 1
        precisions = ConfigPrecisionType.DYNAMIC_QUANT if options["dynamic_quant_only_partitioner"] else None
        return EdgefuseXnnpackPartitioner(
            config_precisions=precisions, enable_bf16=options["enable_bf16"], single_row=swap.single_row
        )

    get_xnnpack_partitioner.__doc__ = original.__doc__
    get_xnnpack_partitioner.__wrapped__ = original
    return get_xnnpack_partitioner


def _partitioner_list(partitioner) -> list:
    if partitioner is None:
        return []
    if isinstance(partitioner, dict):
        return [p for ps in partitioner.values() for p in ps]
    return list(partitioner)


def _method_names(programs) -> list[str]:
    return list(programs) if isinstance(programs, dict) else ["forward"]


def with_substitution(transform_passes, programs, make_pass: Callable[[], Any]):
    """``transform_passes`` (``None``, a list, or a dict of lists by method) with ``make_pass()`` last for
    every method; a pass manager, which cannot be extended, is refused."""
    if transform_passes is None or isinstance(transform_passes, (list, tuple)):
        return [*(transform_passes or []), make_pass()]
    if isinstance(transform_passes, dict):
        return {name: [*transform_passes.get(name, []), make_pass()] for name in _method_names(programs)}
    raise LoweringSwapError(
        f"edgefuse adds its substitution to a list or a dict of transform passes, got {type(transform_passes).__name__}"
    )


def _lowering(original: Callable, swap: Swap) -> Callable:
    """``to_edge_transform_and_lower`` that substitutes before and restores after edgefuse's partitioners."""
    from edgefuse.xnnpack.lowering import restore_undelegated
    from edgefuse.xnnpack.partitioner import EdgefuseXnnpackPartitioner
    from edgefuse.xnnpack.substitute import SubstituteForXnnpack

    def to_edge_transform_and_lower(*args, **kwargs):
        bound = _LOWERING_SIGNATURE.bind(*args, **kwargs)
        partitioners = _partitioner_list(bound.arguments.get("partitioner"))
        if not any(isinstance(p, EdgefuseXnnpackPartitioner) for p in partitioners):
            return original(*args, **kwargs)
        substitutions: list[SubstituteForXnnpack] = []

        def substitute() -> SubstituteForXnnpack:
            substitutions.append(SubstituteForXnnpack())
            return substitutions[-1]

        swap.lowering_started = True
        programs = bound.arguments.get("programs")
        bound.arguments["transform_passes"] = with_substitution(
            bound.arguments.get("transform_passes"), programs, substitute
        )
        manager, restore = restore_undelegated(original(*bound.args, **bound.kwargs))
        swap.lowerings.append(
            Lowering(
                partitioners=[type(p).__name__ for p in partitioners],
                substituted=sum(len(s.substituted) for s in substitutions),
                restored=len(restore.restored),
                manager=manager,
            )
        )
        return manager

    to_edge_transform_and_lower.__doc__ = original.__doc__
    to_edge_transform_and_lower.__wrapped__ = original
    return to_edge_transform_and_lower


def write_atomically(original: Callable, swap: Swap) -> Callable:
    """``save_pte_program`` writing to a temporary file beside the destination, then moving it there.

    The released writer opens the destination, writes, and on an error logs it and returns the name as
    if it had written it; this one raises, and leaves no file.
    """

    from edgefuse.runtime.files import replace_atomically

    def save_pte_program(prog, model_name: str, output_dir: str = "") -> str:
        filename = model_name if model_name.endswith(".pte") else os.path.join(output_dir, f"{model_name}.pte")

        def write(file) -> None:
            prog.write_to_file(file)
            prog.write_tensor_data_to_file(outdir=output_dir)

        replace_atomically(filename, write)
        swap.written.append(filename)
        return filename

    save_pte_program.__wrapped__ = original
    return save_pte_program


@contextlib.contextmanager
def _swapped(swap: Swap, targets) -> Iterator[Swap]:
    """Set each ``(module, name, make)`` of ``targets`` to ``make(released, swap)`` for the block; put the
    released functions back when it exits. One block at a time per process: module attributes are
    shared by every thread."""
    if not _active.acquire(blocking=False):
        raise LoweringSwapError("edgefuse's LLM export swap is already active; blocks cannot be nested")
    saved: list[tuple[Any, str, Any]] = []
    try:
        replacements = []
        for module, name, make in targets:
            owner, original = _resolve(module, name)
            replacements.append((owner, name, original, make(original, swap)))
        for owner, name, original, replacement in replacements:
            saved.append((owner, name, original))
            setattr(owner, name, replacement)
        yield swap
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
        _active.release()


def edgefuse_lowering(single_row: str | None = None) -> contextlib.AbstractContextManager[Swap]:
    """Within the ``with`` block, ExecuTorch's LLM export lowers for XNNPACK with edgefuse and writes its
    ``.pte`` atomically; the released functions are back when the block exits, whether it returns or
    raises. ``single_row`` is the single-row mean policy (:mod:`edgefuse.xnnpack.policy`; default
    ``"delegate"``). The block yields a :class:`Swap` that records what ran.
    """
    from edgefuse.xnnpack.policy import DEFAULT_SINGLE_ROW_POLICY, check_policy

    swap = Swap(check_policy(single_row or DEFAULT_SINGLE_ROW_POLICY))
    targets = [(m, n, _partitioner_factory) for m, n in PARTITIONER_FACTORIES]
    targets += [(m, n, _lowering) for m, n in LOWERINGS]
    targets += [(m, n, write_atomically) for m, n in WRITERS]
    return _swapped(swap, targets)


def atomic_pte_writes() -> contextlib.AbstractContextManager[Swap]:
    """Only the atomic ``.pte`` writer of :func:`edgefuse_lowering`: ExecuTorch's own lowering, with no
    partial file left by a failed write (stock's program, for a comparison)."""
    return _swapped(Swap(), [(m, n, write_atomically) for m, n in WRITERS])


def swapped() -> dict[str, bool]:
    """For each attribute a block may swap (``module.name``), whether it holds edgefuse's replacement
    now: all False outside a block."""
    result = {}
    for module, name in (*PARTITIONER_FACTORIES, *LOWERINGS, *WRITERS):
        value = getattr(importlib.import_module(module), name)
        result[f"{module}.{name}"] = getattr(value, "__module__", "") == __name__
    return result
