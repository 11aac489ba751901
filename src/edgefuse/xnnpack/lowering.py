"""``lower``: an exported program to a lowered ``EdgeProgramManager`` with every mean, norm cast and eps add delegated.

:func:`lower_stock` is ExecuTorch's own XNNPACK lowering, the one edgefuse is compared with, and
:func:`lower_with` picks either by name (:data:`STOCK`, :data:`EDGEFUSE`).

edgefuse's flow is ExecuTorch's ``to_edge_transform_and_lower`` with edgefuse's substitution as a transform
pass and edgefuse's partitioner, followed by the restoration of anything left outside a delegate. The
result is an ordinary ``EdgeProgramManager``: ``.to_executorch()`` gives a program that loads on the
released 1.5.1 runtime, since every node it serializes is a node type that runtime has.
"""

from __future__ import annotations

import gc
from typing import Any

from torch.export import ExportedProgram

from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge_transform_and_lower

from edgefuse.core.programs import detached
from edgefuse.xnnpack.partitioner import EdgefuseXnnpackPartitioner
from edgefuse.xnnpack.policy import DEFAULT_SINGLE_ROW_POLICY, check_policy
from edgefuse.xnnpack.substitute import RestoreUndelegated, SubstituteForXnnpack


STOCK = "stock"
EDGEFUSE = "edgefuse"

#: The keyword arguments the released ``XnnpackPartitioner`` and its configs read. The partitioner
#: itself takes any keyword and ignores what it does not read; ``lower`` refuses a misspelt one.
PARTITIONER_OPTIONS = (
    "configs", "config_precisions", "per_op_mode", "verbose", "enable_bf16", "force_non_static_weights_for_f32_linear",
)


def lower(
    exported_program: ExportedProgram,
    *,
    single_row: str = DEFAULT_SINGLE_ROW_POLICY,
    means: bool = True,
    casts: bool = True,
    adds: bool = True,
    gelus: bool = True,
    compile_config: EdgeCompileConfig | None = None,
    **partitioner_kwargs: Any,
) -> EdgeProgramManager:
    """Lower ``exported_program`` to XNNPACK with edgefuse's means, casts, scalar adds, squares and tanh GELUs.

    ``single_row`` is the single-row mean policy (:mod:`edgefuse.xnnpack.policy`); ``means``, ``casts``,
    ``adds`` and ``gelus`` turn the substitutions off one at a time (to measure them; a tanh GELU not
    substituted stays outside the delegate); ``compile_config`` goes to
    ``to_edge_transform_and_lower``; every other keyword goes to :class:`EdgefuseXnnpackPartitioner`
    and from there to ``XnnpackPartitioner`` (``enable_bf16``, ``config_precisions``, ...).
    """
    if not isinstance(exported_program, ExportedProgram):
        raise TypeError(
            f"lower takes a torch.export.ExportedProgram, got {type(exported_program).__name__}; "
            "call torch.export.export(module, inputs) first"
        )
    check_policy(single_row)
    for name, value in (("means", means), ("casts", casts), ("adds", adds), ("gelus", gelus)):
        if not isinstance(value, bool):
            raise TypeError(f"lower's {name} is True or False, got {value!r}")
    if compile_config is not None and not isinstance(compile_config, EdgeCompileConfig):
        raise TypeError(f"compile_config is an executorch.exir.EdgeCompileConfig, got {type(compile_config).__name__}")
    unknown = sorted(set(partitioner_kwargs) - set(PARTITIONER_OPTIONS))
    if unknown:
        raise TypeError(
            f"lower got unknown options {', '.join(unknown)}; it takes single_row, means, casts, adds, gelus, "
            f"compile_config and XnnpackPartitioner's {', '.join(PARTITIONER_OPTIONS)}"
        )
    partitioner = EdgefuseXnnpackPartitioner(single_row=single_row, **partitioner_kwargs)
    manager = to_edge_transform_and_lower(
        detached(exported_program),  # the caller's program keeps the constants a delegate takes in
        transform_passes=[SubstituteForXnnpack(means=means, casts=casts, adds=adds, gelus=gelus)],
        partitioner=[partitioner],
        compile_config=compile_config,
    )
    return restore_undelegated(manager)[0]


#: The bytes the delegates hold (their blobs and their constants) from which :func:`restore_undelegated`
#: collects the programs partitioning replaced: a full collection takes about 0.2 s of CPU in a process
#: holding torch and ExecuTorch, as much as a fifth of a small program's lowering, and frees memory worth it
#: only for large constants.
COLLECT_FROM_BYTES = 64 * 2**20


def restore_undelegated(manager: EdgeProgramManager) -> tuple[EdgeProgramManager, RestoreUndelegated]:
    """``manager`` with every edgefuse op left outside a delegate put back (:class:`RestoreUndelegated`),
    and the pass, which names what it restored.

    The programs that partitioning replaced are reference cycles holding their own copies of the
    constants the delegates took in, freed only when Python's cycle collector runs; once the delegates
    hold :data:`COLLECT_FROM_BYTES` or more, they are collected here, so the program goes on to
    ``to_executorch`` without them (for Qwen3-0.6B's width in 8da4w, the 151,936 x 1024 int8 output
    weight among them).
    """
    restore = RestoreUndelegated()
    manager = manager.transform([restore])
    if delegated_bytes(manager) >= COLLECT_FROM_BYTES:
        gc.collect()
    return manager, restore


def delegated_bytes(manager: EdgeProgramManager) -> int:
    """The bytes the delegates of every method of ``manager`` hold: each blob, and the constants it keeps in
    its named data, where ExecuTorch 1.5's XNNPACK puts every weight (the blob holds the graph alone)."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    total = 0
    for method in manager.methods:
        for module in manager.exported_program(method).graph_module.modules():
            if isinstance(module, LoweredBackendModule):
                named = module.named_data_store_output
                total += len(module.processed_bytes) + (sum(map(len, named.buffers)) if named else 0)
    return total


def lower_stock(exported_program: ExportedProgram, **partitioner_kwargs: Any) -> EdgeProgramManager:
    """ExecuTorch's own XNNPACK lowering of ``exported_program``: ``to_edge_transform_and_lower`` with
    ``XnnpackPartitioner(**partitioner_kwargs)``, on a :func:`~edgefuse.core.programs.detached` program so
    that the caller's can be lowered again."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return to_edge_transform_and_lower(detached(exported_program), partitioner=[XnnpackPartitioner(**partitioner_kwargs)])


def lower_with(exported_program: ExportedProgram, how: str) -> EdgeProgramManager:
    """Lower ``exported_program`` with ``how``: :data:`STOCK` (:func:`lower_stock`) or :data:`EDGEFUSE`
    (:func:`lower` with its default options)."""
    if how == STOCK:
        return lower_stock(exported_program)
    if how == EDGEFUSE:
        return lower(exported_program)
    raise ValueError(f"unknown lowering {how!r}; choose {STOCK!r} or {EDGEFUSE!r}")
