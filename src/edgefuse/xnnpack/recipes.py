"""Export recipes for ``executorch.export.export`` that lower with edgefuse's XNNPACK partitioner and passes.

Importing this module registers :class:`EdgefuseRecipeProvider` (backend ``"edgefuse_xnnpack"``) with
ExecuTorch's recipe registry, so::

    from executorch.export import ExportRecipe, export
    from edgefuse.xnnpack.recipes import EdgefuseRecipeType

    session = export(model, [inputs], export_recipe=ExportRecipe.get_recipe(EdgefuseRecipeType.FP32))
    session.save_pte_file("model.pte")

Each type mirrors the XNNPACK recipe of ExecuTorch 1.5.1 with the same name (same quantization, same
edge compile config, same backend config, same ``group_size`` option): the recipe is stock's, with its
lowering replaced. The lowering runs :class:`~edgefuse.xnnpack.SubstituteForXnnpack` before
partitioning, partitions with :class:`~edgefuse.xnnpack.EdgefuseXnnpackPartitioner` and runs
:class:`~edgefuse.xnnpack.RestoreUndelegated` after it. Stock builds its partitioner with
``precision_type=``, an option ``XnnpackPartitioner`` hands to its configs and none of them reads, so
every stock recipe partitions every precision; these do the same.

``FP16`` and ``BF16`` have no stock counterpart: they are for a model and inputs already in float16 or
bfloat16 (a recipe cannot change the dtype of the inputs it exports with). ``FP16`` lowers as ``FP32``
does; ``BF16`` enables XNNPACK's bfloat16 path (``enable_bf16=True``), which no stock recipe does.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from executorch.backends.xnnpack.recipes.xnnpack_recipe_provider import XNNPACKRecipeProvider
from executorch.backends.xnnpack.recipes.xnnpack_recipe_types import XNNPackRecipeType
from executorch.backends.xnnpack.utils.configs import (
    get_xnnpack_edge_compile_config,
    get_xnnpack_executorch_backend_config,
)
from executorch.export import BackendRecipeProvider, ExportRecipe, LoweringRecipe, RecipeType, recipe_registry

from edgefuse.xnnpack.inspect import lowered_modules
from edgefuse.xnnpack.partitioner import EdgefuseXnnpackPartitioner
from edgefuse.xnnpack.policy import DEFAULT_SINGLE_ROW_POLICY, check_policy
from edgefuse.xnnpack.substitute import RestoreUndelegated, SubstituteForXnnpack

logger = logging.getLogger(__name__)

BACKEND = "edgefuse_xnnpack"


class EdgefuseRecipeType(RecipeType):
    """The recipe types of :class:`EdgefuseRecipeProvider`: each stock XNNPACK type, and FP16 and BF16."""

    FP32 = "edgefuse_xnnpack_fp32"
    FP16 = "edgefuse_xnnpack_fp16"
    BF16 = "edgefuse_xnnpack_bf16"
    PT2E_INT8_DYNAMIC_PER_CHANNEL = "edgefuse_xnnpack_pt2e_int8_dynamic_per_channel"
    PT2E_INT8_STATIC_PER_CHANNEL = "edgefuse_xnnpack_pt2e_int8_static_per_channel"
    PT2E_INT8_STATIC_PER_TENSOR = "edgefuse_xnnpack_pt2e_int8_static_per_tensor"
    TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL = "edgefuse_xnnpack_torchao_int8da_int4w_per_channel"
    TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR = "edgefuse_xnnpack_torchao_int8da_int4w_per_tensor"

    @classmethod
    def get_backend_name(cls) -> str:
        return BACKEND

    @property
    def stock(self) -> XNNPackRecipeType | None:
        """The stock XNNPACK recipe type this one mirrors (None for FP16 and BF16)."""
        return STOCK_TYPES.get(self)


#: Each mirrored type and the stock type it mirrors.
STOCK_TYPES = {
    EdgefuseRecipeType[stock.name]: stock for stock in XNNPackRecipeType if stock.name in EdgefuseRecipeType.__members__
}


def _substitute_before_partitioning(method_name: str, program) -> list:
    """The edge transform: the substitution, for a program not yet lowered. ExecuTorch also hands a
    recipe's edge transforms the lowered program when the recipe has manager transforms (the
    restoration); substituting there would only be undone."""
    return [] if lowered_modules(program) else [SubstituteForXnnpack()]


def _restore_after_partitioning(manager) -> list:
    return [RestoreUndelegated()]


def edgefuse_lowering_recipe(enable_bf16: bool = False, single_row: str = DEFAULT_SINGLE_ROW_POLICY) -> LoweringRecipe:
    """The lowering of every edgefuse recipe: substitution, edgefuse's partitioner, restoration."""
    return LoweringRecipe(
        partitioners=[EdgefuseXnnpackPartitioner(enable_bf16=enable_bf16, single_row=single_row)],
        edge_transform_passes=[_substitute_before_partitioning],
        edge_manager_transform_passes=[_restore_after_partitioning],
        edge_compile_config=get_xnnpack_edge_compile_config(),
    )


class EdgefuseRecipeProvider(BackendRecipeProvider):
    """Builds :class:`EdgefuseRecipeType` recipes. ``single_row`` (a keyword of ``create_recipe`` and
    ``ExportRecipe.get_recipe``) is edgefuse's single-row mean policy; other keywords are stock's."""

    @property
    def backend_name(self) -> str:
        return BACKEND

    def get_supported_recipes(self) -> Sequence[RecipeType]:
        return list(EdgefuseRecipeType)

    def create_recipe(self, recipe_type: RecipeType, **kwargs: Any) -> Optional[ExportRecipe]:
        if recipe_type not in self.get_supported_recipes():
            return None
        single_row = check_policy(kwargs.pop("single_row", DEFAULT_SINGLE_ROW_POLICY))
        stock = STOCK_TYPES.get(recipe_type)
        if stock is None:  # FP16, BF16
            if kwargs:
                logger.warning("edgefuse recipe %r ignores unexpected parameters %s", recipe_type.value, sorted(kwargs))
            return ExportRecipe(
                name=recipe_type.value,
                lowering_recipe=edgefuse_lowering_recipe(recipe_type is EdgefuseRecipeType.BF16, single_row),
                executorch_backend_config=get_xnnpack_executorch_backend_config(),
            )
        recipe = XNNPACKRecipeProvider().create_recipe(stock, **kwargs)
        if recipe is None or recipe.lowering_recipe is None:
            raise RuntimeError(f"ExecuTorch's XNNPACK provider built no lowering for {stock.value}")
        recipe.name = recipe_type.value
        recipe.lowering_recipe = edgefuse_lowering_recipe(False, single_row)
        return recipe


recipe_registry.register_backend_recipe_provider(EdgefuseRecipeProvider())
