"""``edgefuse.llm``, the library: the swap into ExecuTorch's LLM export, the atomic writer, the recipes.

No export runs here; the exports are in ``tests/cli/test_export_llm.py``.
"""

from __future__ import annotations

import os

import pytest

from edgefuse.llm import lowering
from edgefuse.llm.lowering import LoweringSwapError, edgefuse_lowering, swapped, write_atomically


def nothing_swapped() -> bool:
    return not any(swapped().values())


def test_swap_puts_the_released_functions_back_on_exit_and_on_error():
    import executorch.examples.models.llama.export_llama_lib as lib

    released = lib.get_xnnpack_partitioner
    assert nothing_swapped()
    with edgefuse_lowering() as swap:
        assert all(swapped().values())
        partitioner = lib.get_xnnpack_partitioner(dynamic_quant_only_partitioner=False, enable_bf16=True)
        assert type(partitioner).__name__ == "EdgefuseXnnpackPartitioner" and swap.partitioners_built == 1
    assert nothing_swapped() and lib.get_xnnpack_partitioner is released
    with pytest.raises(KeyError):
        with edgefuse_lowering():
            raise KeyError("inside the block")
    assert nothing_swapped() and lib.get_xnnpack_partitioner is released


def test_a_second_block_inside_the_first_is_refused_and_both_restore():
    with edgefuse_lowering():
        with pytest.raises(LoweringSwapError, match="cannot be nested"):
            with edgefuse_lowering():
                pass
        assert all(swapped().values())
    assert nothing_swapped()


def test_the_dynamic_quantization_partitioner_keeps_its_precision():
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
    from executorch.extension.llm.export import partitioner_lib

    with edgefuse_lowering():
        dynamic = partitioner_lib.get_xnnpack_partitioner(dynamic_quant_only_partitioner=True)
        full = partitioner_lib.get_xnnpack_partitioner(dynamic_quant_only_partitioner=False)
    precisions = {tuple(c.enabled_precision_types) for c in dynamic.target_partitioner_configs.values()}
    assert precisions <= {(ConfigPrecisionType.DYNAMIC_QUANT,), ()}
    assert any(ConfigPrecisionType.FP32 in c.enabled_precision_types for c in full.target_partitioner_configs.values())
    assert any(type(c).__name__ == "XnnMeanConfig" for c in full.target_partitioner_configs.values())


class _FailingProgram:
    """Writes part of a program, then fails, as a full disk would."""

    def write_to_file(self, file):
        file.write(b"PTE-HEAD")
        raise OSError(28, "No space left on device")

    def write_tensor_data_to_file(self, outdir):
        pass


def test_a_failed_write_leaves_no_file_and_raises(tmp_path):
    released = lambda *a: None  # noqa: E731
    save = write_atomically(released, lowering.Swap())
    with pytest.raises(OSError, match="No space"):
        save(_FailingProgram(), str(tmp_path / "model.pte"), str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_every_stock_xnnpack_recipe_type_has_an_edgefuse_twin_built_like_it():
    from executorch.backends.xnnpack.recipes import XNNPackRecipeType
    from executorch.export import ExportRecipe, recipe_registry

    from edgefuse.xnnpack.recipes import BACKEND, EdgefuseRecipeType
    from edgefuse.xnnpack import EdgefuseXnnpackPartitioner

    assert set(recipe_registry.get_supported_recipes(BACKEND)) == set(EdgefuseRecipeType)
    assert {t.name for t in XNNPackRecipeType} | {"FP16", "BF16"} == {t.name for t in EdgefuseRecipeType}
    for recipe_type in EdgefuseRecipeType:
        ours = ExportRecipe.get_recipe(recipe_type)
        (partitioner,) = ours.lowering_recipe.partitioners
        assert isinstance(partitioner, EdgefuseXnnpackPartitioner), recipe_type
        assert ours.lowering_recipe.edge_transform_passes and ours.lowering_recipe.edge_manager_transform_passes
        if recipe_type.stock is None:
            continue
        stock = ExportRecipe.get_recipe(recipe_type.stock)
        assert type(ours.quantization_recipe) is type(stock.quantization_recipe), recipe_type
        if stock.quantization_recipe is not None:
            assert [type(q) for q in stock.quantization_recipe.quantizers or []] == \
                [type(q) for q in ours.quantization_recipe.quantizers or []]
            assert [type(c.ao_base_config) for c in stock.quantization_recipe.ao_quantization_configs or []] == \
                [type(c.ao_base_config) for c in ours.quantization_recipe.ao_quantization_configs or []]
        assert ours.lowering_recipe.edge_compile_config == stock.lowering_recipe.edge_compile_config


@pytest.mark.parametrize("quantized", (False, True))
def test_export_llms_edge_config_keeps_rms_norm_whole_only_for_a_quantized_qnn_config(quantized):
    # A quantized config's norms are rebuilt and quantized before export_llm's to_edge, which must keep
    # them whole; a float config's to_edge decomposes a norm the model wrote, as the released flow does.
    import torch
    from executorch.extension.llm.export.builder import LLMEdgeManager

    from edgefuse.llm.qnn import rms_norm_kept_at_edge

    released = LLMEdgeManager.__dict__["_get_edge_config"]
    manager = LLMEdgeManager.__new__(LLMEdgeManager)
    manager.skip_dim_order = False
    with rms_norm_kept_at_edge(lambda: quantized):
        kept = torch.ops.aten.rms_norm.default in (LLMEdgeManager._get_edge_config(manager).preserve_ops or [])
    assert kept == quantized
    assert LLMEdgeManager.__dict__["_get_edge_config"] is released


def test_the_qnn_causal_mask_adds_the_value_asked_for_where_a_token_may_not_look_and_is_put_back():
    import torch
    from executorch.examples.models.llama import export_llama_lib

    from edgefuse.llm.qnn import qnn_causal_mask

    released = export_llama_lib.replace_causal_mask
    attention = torch.nn.Module()
    attention.register_buffer("mask", torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    model = torch.nn.Sequential(attention)
    with qnn_causal_mask(-255.0):
        export_llama_lib.replace_causal_mask(model)
    assert torch.equal(attention.mask, torch.tensor([[0.0, -255, -255], [0, 0, -255], [0, 0, 0]]))
    assert export_llama_lib.replace_causal_mask is released


def test_the_token_tokenizer_reads_its_text_as_the_tokens_and_never_ends_a_calibration(tmp_path):
    import torch
    from pytorch_tokenizers import get_tokenizer

    from edgefuse.llm.eager import token_text, write_token_tokenizer

    tokenizer = get_tokenizer(write_token_tokenizer(str(tmp_path), 256))
    tokens = torch.tensor([5, 17, 255, 0])
    assert tokenizer.encode(token_text(tokens), bos=True, eos=False) == tokens.tolist()
    assert tokenizer.eos_id is None  # export_llm's calibration stops at an end token: it has none


@pytest.mark.slow
def test_the_swapped_lowering_leaves_no_constant_to_the_cycle_collector(monkeypatch):
    """export_llm's lowering inside the swap frees the constants of the programs partitioning replaced
    before it returns (``tests/xnnpack/test_lowering_memory.py`` holds the same of ``xnnpack.lower``)."""
    from executorch.extension.llm.export import builder

    from edgefuse.xnnpack import lowering
    from edgefuse.xnnpack.partitioner import EdgefuseXnnpackPartitioner
    from tests.harness import tensors_left_to_the_collector

    monkeypatch.setattr(lowering, "COLLECT_FROM_BYTES", 512 * 64 * 4)  # the delegates hold the 512 x 64 weight

    with edgefuse_lowering() as swap:
        left = tensors_left_to_the_collector(
            lambda program: builder.to_edge_transform_and_lower(program, partitioner=[EdgefuseXnnpackPartitioner()])
        )
    assert len(swap.lowerings) == 1 and left == []
