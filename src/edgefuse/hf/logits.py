"""The logits a check of a Hugging Face export compares: the eager model saved in a folder, built from its own
files (nothing is downloaded), and the programs optimum-executorch wrote from it, over the same prompt and
single-token decode steps."""

from __future__ import annotations

import gc
import json
import os

import torch


def eager_model(model_dir: str | os.PathLike, dtype: torch.dtype, qlinear: str | None = None,
                qembedding: str | None = None):
    """The causal LM saved in ``model_dir`` by ``save_pretrained``, in ``dtype``, built from its ``config.json``
    and its ``.safetensors`` weights alone (a tied output projection tied again, as transformers ties it), and
    quantized as optimum's ``text-generation`` task quantizes it when ``qlinear`` or ``qembedding`` ask."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(os.path.join(model_dir, "config.json")) as f:
        fields = json.load(f)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    weights = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            weights.update(load_file(os.path.join(model_dir, name)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if config.get_text_config().tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"{os.fspath(model_dir)}: its weights do not fit its config (missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)})")
    model.tie_weights()
    del weights
    model.eval()
    if qlinear or qembedding:
        from optimum.exporters.executorch.quantization import quantize_model_

        quantize_model_(model, qlinear_config=qlinear, qembedding_config=qembedding)
    return model


def eager_logits(model, sequence: torch.Tensor, prefill: int) -> list[torch.Tensor]:
    """The eager ``model``'s logits over ``sequence`` (``[1, n]``) at the prompt's last position (the first
    ``prefill`` tokens), then at each later token's: one causal pass computes them all."""
    with torch.no_grad():
        logits = model(input_ids=sequence).logits
    return [logits[:, position] for position in range(prefill - 1, sequence.shape[1])]


def program_logits(pte: bytes | str, sequence: torch.Tensor, prefill: int) -> list[torch.Tensor]:
    """A program's logits at :func:`eager_logits`' positions: the prompt in one call, or one call a token where
    the program takes one token a call (exported with static shapes, as optimum exports Gemma 3), then each
    token in a call of its own, each with its cache positions. ``pte`` is the program's bytes or file name."""
    from edgefuse.runtime import LoadedProgram, takes_one_token
    from edgefuse.runtime import prefill as prefilled

    loaded = LoadedProgram(pte)  # holds the program, which must outlive its method
    method = loaded.method

    def run(start: int, end: int) -> torch.Tensor:
        return method.execute([sequence[:, start:end], torch.arange(start, end)])[0][:, -1]

    prompt = prefilled(run, prefill, takes_one_token(method))
    logits = [prompt] + [run(p, p + 1) for p in range(prefill, sequence.shape[1])]
    del method, loaded
    gc.collect()
    return logits
