"""The eager side of an export_llm check: the model files written for it (edgefuse.llm.eager)."""

from __future__ import annotations

import json

import pytest
import torch

from edgefuse.llm.eager import write_small_model
from edgefuse.llm.small import SMALL_QWEN3


def test_the_params_file_holds_the_params_and_a_tied_output_is_the_embedding(tmp_path):
    """Models that tie their embeddings (Qwen3, Llama 3.2) load one tensor as both: the checkpoint saves it
    once, and an untied one has an output of its own."""
    for tied in (True, False):
        folder = tmp_path / str(tied)
        folder.mkdir()
        params_path, checkpoint_path = write_small_model(str(folder), SMALL_QWEN3, tied=tied)
        assert json.loads(open(params_path).read()) == SMALL_QWEN3
        state = torch.load(checkpoint_path)
        same = state["output.weight"].data_ptr() == state["tok_embeddings.weight"].data_ptr()
        assert same == tied
        assert torch.equal(state["output.weight"], state["tok_embeddings.weight"]) == tied


def test_the_random_weights_are_the_seeds_whatever_device_the_model_is_built_on(tmp_path):
    """Built on the meta device (no memory for a model of a billion parameters), the checkpoint holds the
    weights :func:`random_state` draws from the seed: norm weights near 1, others of order 1/sqrt(fan-in)."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    from edgefuse.llm.eager import random_state

    _, checkpoint_path = write_small_model(str(tmp_path), SMALL_QWEN3, seed=3)
    state = torch.load(checkpoint_path)
    expected = random_state(construct_transformer(ModelArgs(**SMALL_QWEN3)), seed=3)
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_norms_removed_leaves_each_norm_its_weights_multiply_and_puts_the_class_back(dtype):
    """Within the block every RMSNorm, of a model built before it or within it (export_llm builds its model
    inside), is its input times its weight in the input's dtype, nothing normalized (an input of 1e-3 would
    come out of a norm near 1); on leaving, and after an error inside, the norm normalizes again."""
    from executorch.examples.models.llama.norm import RMSNorm

    from edgefuse.llm.eager import norms_removed

    before = RMSNorm(16).to(dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        before.weight.copy_(1 + torch.rand(16, generator=generator))
        x = (torch.randn(4, 16, generator=generator) * 1e-3).to(dtype)
        normalized = before(x)
        assert normalized.abs().max() > 0.5
        with norms_removed():
            within = RMSNorm(16).to(dtype)
            within.weight.copy_(before.weight)
            for norm in (before, within):
                out = norm(x)
                assert out.dtype == dtype and torch.equal(out, x * before.weight)
        assert torch.equal(before(x), normalized)
        with pytest.raises(RuntimeError, match="inside"):
            with norms_removed():
                raise RuntimeError("inside")
        assert torch.equal(before(x), normalized)


def test_norms_removed_keeps_a_unit_offset_norms_one_plus_weight():
    from executorch.examples.models.llama.norm import RMSNorm

    from edgefuse.llm.eager import norms_removed

    norm = RMSNorm(8, add_unit_offset=True)
    x = torch.randn(2, 8)
    with torch.no_grad(), norms_removed():
        norm.weight.fill_(0.5)
        assert torch.equal(norm(x), x * 1.5)


@pytest.mark.parametrize("name", ["qwen3-0.6b", "llama-3.2-1b"])
def test_every_norm_of_the_scale_commands_models_is_the_class_norms_removed_reaches(name):
    """norms_removed patches ExecuTorch's ``RMSNorm`` class alone: each norm the scale command's Qwen3 and
    Llama hold (two a layer, Qwen3's QK norms, the final one) must be one of it, no ``ScalelessRMSNorm`` or
    ``torch.nn.RMSNorm`` that would keep its mean in the program said to hold none (built on the meta device)."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs
    from executorch.examples.models.llama.norm import RMSNorm

    from edgefuse.tools.scale import SHAPES, norm_count

    params = dict(SHAPES[name].params, n_layers=2)
    with torch.device("meta"):
        model = construct_transformer(ModelArgs(**params))
    norms = [m for m in model.modules() if "norm" in type(m).__name__.lower()]
    assert norms and all(type(m) is RMSNorm for m in norms), {type(m).__name__ for m in norms}
    assert len(norms) == norm_count(params)
