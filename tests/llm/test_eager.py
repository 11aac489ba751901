"""The eager side of an export_llm check: the model files written for it (edgefuse.llm.eager)."""

from __future__ import annotations

import json

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
