"""Tiny Hugging Face models saved locally from configs with random weights, and their logits: eager, and the
programs optimum-executorch wrote, over a prompt and decode steps."""

from __future__ import annotations

import os

import torch

#: What the tiny models share: one decoder layer (Gemma3 two: a sliding one and a full one), heads of 32.
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, head_dim=32, vocab_size=256, max_position_embeddings=128,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)

#: The prompt's tokens, then the decode steps of one token.
PREFILL, DECODE = 8, 4


def config(name: str):
    """The transformers config of one of the four architectures."""
    import transformers

    if name == "gemma3":
        return transformers.Gemma3TextConfig(**{**COMMON, "num_hidden_layers": 2}, sliding_window=16,
                                             layer_types=["sliding_attention", "full_attention"])
    classes = {"qwen3": transformers.Qwen3Config, "llama": transformers.LlamaConfig,
               "smollm3": transformers.SmolLM3Config}
    return classes[name](**COMMON)


def save_model(folder: str, name: str, seed: int = 0) -> str:
    """Save a random-weight model of architecture ``name`` with ``save_pretrained`` in ``folder/name``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    path = os.path.join(folder, name)
    AutoModelForCausalLM.from_config(config(name)).save_pretrained(path)
    return path


def tokens(vocab: int) -> torch.Tensor:
    """The prompt and the decode steps' tokens, one sequence ``[1, PREFILL + DECODE]``."""
    return torch.randint(3, vocab, (1, PREFILL + DECODE), generator=torch.Generator().manual_seed(0))


def eager_logits(model_dir: str, dtype: torch.dtype, qlinear: str | None = None,
                 qembedding: str | None = None) -> list[torch.Tensor]:
    """The eager model's logits at the prompt's last position, then at each decode step's, quantized as
    optimum's task quantizes it (``quantize_model_``) when asked (:mod:`edgefuse.hf.logits`)."""
    from edgefuse.hf import logits

    model = logits.eager_model(model_dir, dtype, qlinear, qembedding)
    return logits.eager_logits(model, tokens(model.config.vocab_size), PREFILL)


def program_logits(path: str, vocab: int) -> list[torch.Tensor]:
    """A program's logits at the same positions (:func:`edgefuse.hf.logits.program_logits`)."""
    from edgefuse.compare.llm_programs import load_llm_kernels
    from edgefuse.hf import logits

    load_llm_kernels()
    return logits.program_logits(path, tokens(vocab), PREFILL)
