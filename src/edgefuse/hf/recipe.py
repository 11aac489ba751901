"""The ``edgefuse-xnnpack`` recipe of optimum-executorch: its ``xnnpack`` recipe with edgefuse's lowering.

optimum-executorch lowers with ``to_edge_transform_and_lower(..., [XnnpackPartitioner()], ...)`` and has no
pass hook; its one extension point is ``register_recipe(name)``, which stores a function in its registry
before an export looks the name up. :func:`register` stores :func:`export_with_edgefuse_xnnpack` there
under :data:`~edgefuse.hf.options.EDGEFUSE_RECIPE`. The recipe takes the model optimum's task built (loaded,
quantized, with its custom SDPA and KV cache as asked) and lowers it as optimum-executorch 1.1.0's
``xnnpack`` recipe does (one program named ``forward``, the same edge compile config, constant methods,
padding-index pass and backend config), with three changes: edgefuse's partitioner (with ``enable_bf16``
for a bfloat16 model, so its kernels stay inside the delegate), edgefuse's substitution before
partitioning, and the restoration of anything left outside after it.

Importing this module imports neither optimum nor ExecuTorch; :func:`register` imports optimum's registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefuse.hf.options import EDGEFUSE_RECIPE


@dataclass
class RecipeRecord:
    """What one run of the recipe did: the means, casts, scalar adds and tanh GELUs edgefuse substituted, and of those
    the ones left outside a delegate and restored."""

    substituted: int = 0
    restored: int = 0


def register() -> None:
    """Register ``edgefuse-xnnpack`` with optimum-executorch's recipe registry (again is harmless).

    Raises ``ImportError`` when optimum-executorch is not installed."""
    from optimum.exporters.executorch.recipe_registry import register_recipe

    register_recipe(EDGEFUSE_RECIPE)(export_with_edgefuse_xnnpack)


def export_with_edgefuse_xnnpack(model, record: RecipeRecord | None = None, **kwargs) -> dict:
    """Lower ``model`` (optimum's ``CausalLMExportableModule`` or another exportable module) for XNNPACK
    with edgefuse; ``{"model": ExecutorchProgramManager}``, as optimum's recipes return. ``record`` (passed
    as ``recipe_kwargs``) is filled in as the recipe runs."""
    import torch
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from optimum.executorch.passes.remove_padding_idx_embedding_pass import RemovePaddingIdxEmbeddingPass

    from edgefuse.xnnpack.partitioner import EdgefuseXnnpackPartitioner
    from edgefuse.xnnpack.lowering import restore_undelegated
    from edgefuse.xnnpack.substitute import SubstituteForXnnpack

    record = record if record is not None else RecipeRecord()
    programs = model.export()
    _check_custom_sdpa(model, programs)
    if len(programs) == 1:  # a single program is the .pte's "forward" method
        programs = {"forward": next(iter(programs.values()))}
    substitution = SubstituteForXnnpack()
    manager = to_edge_transform_and_lower(
        programs,
        partitioner=[EdgefuseXnnpackPartitioner(enable_bf16=model.model.dtype == torch.bfloat16)],
        compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
        constant_methods=model.metadata,
        transform_passes=[RemovePaddingIdxEmbeddingPass(), substitution],
    )
    manager, restore = restore_undelegated(manager)
    record.substituted, record.restored = len(substitution.substituted), len(restore.restored)
    program = manager.to_executorch(config=ExecutorchBackendConfig(
        extract_delegate_segments=True,
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
        do_quant_fusion_and_const_prop=True,
    ))
    return {"model": program}


def _check_custom_sdpa(model, programs) -> None:
    """Refuse a model loaded for ExecuTorch's custom SDPA whose exported programs do not call it, as
    optimum's recipe does: the attention would not be the one the KV cache was laid out for."""
    if model.config._attn_implementation not in ("custom_sdpa", "custom_sdpa_ring_kv_cache"):
        return
    if not any(node.op == "call_function" and "custom_sdpa" in str(node.target)
               for program in programs.values() for node in program.graph_module.graph.nodes):
        raise ValueError("'custom_sdpa' not found in the graph.")
