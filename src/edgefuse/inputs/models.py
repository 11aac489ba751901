"""Tiny, randomly initialised Hugging Face models that export with torch.export.

Each model is built from a config written here (nothing is downloaded), so
tests and demos get real transformer graphs that run each family's own,
unmodified RMSNorm code. Needs the optional ``transformers`` dependency
(``pip install edgefuse[models]``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

# Shared tiny shape: every decoder gets these, plus its entry in _SPECS.
_TINY: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=128,
    max_position_embeddings=64,
    # The families' default special-token ids lie outside a 128-token vocab.
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    # Plain matmul/softmax attention: exports alike for every family, and is
    # the only implementation Gemma2 (attention logit soft-capping) supports.
    attn_implementation="eager",
)


class _Spec(NamedTuple):
    """How to build one tiny model: transformers class names plus config values."""

    model_cls: str
    config_cls: str
    config: dict[str, Any]
    seq2seq: bool = False


_SPECS: dict[str, _Spec] = {
    "tiny-llama": _Spec("LlamaForCausalLM", "LlamaConfig", _TINY),
    "tiny-qwen2": _Spec("Qwen2ForCausalLM", "Qwen2Config", _TINY),
    "tiny-qwen3": _Spec("Qwen3ForCausalLM", "Qwen3Config", _TINY),
    "tiny-mistral": _Spec("MistralForCausalLM", "MistralConfig", {**_TINY, "sliding_window": 16}),
    "tiny-phi3": _Spec("Phi3ForCausalLM", "Phi3Config", _TINY),
    "tiny-smollm3": _Spec("SmolLM3ForCausalLM", "SmolLM3Config", _TINY),
    "tiny-granite": _Spec("GraniteForCausalLM", "GraniteConfig", _TINY),
    "tiny-olmo2": _Spec("Olmo2ForCausalLM", "Olmo2Config", _TINY),
    "tiny-gemma": _Spec("GemmaForCausalLM", "GemmaConfig", _TINY),
    "tiny-gemma2": _Spec(
        "Gemma2ForCausalLM",
        "Gemma2Config",
        {**_TINY, "sliding_window": 16, "query_pre_attn_scalar": 16},
    ),
    "tiny-gemma3": _Spec(
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        {
            **_TINY,
            "sliding_window": 16,
            "query_pre_attn_scalar": 16,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "tiny-t5": _Spec(
        "T5ForConditionalGeneration",
        "T5Config",
        dict(
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            vocab_size=128,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=64,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
            attn_implementation="eager",
        ),
        seq2seq=True,
    ),
    "tiny-mamba2": _Spec(
        "Mamba2ForCausalLM",
        "Mamba2Config",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_heads=8,  # num_heads * head_dim must equal expand * hidden_size
            head_dim=16,
            expand=2,
            n_groups=2,  # gated norm works on 2 groups of 64 channels
            state_size=16,
            chunk_size=8,
            vocab_size=128,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
}

MODEL_NAMES: tuple[str, ...] = tuple(_SPECS)


class _LogitsOnly(torch.nn.Module):
    """Calls a Hugging Face model without a KV cache and returns only its logits.

    torch.export wants plain tensors in and out; HF models take many optional
    keyword arguments and return output dataclasses, so this pins them down.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        kwargs = {} if decoder_input_ids is None else {"decoder_input_ids": decoder_input_ids}
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True, **kwargs).logits


def jitter_norm_weights(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Add small noise to every norm weight, which HF (and ExecuTorch's Llama) initialise to a constant.

    With w == 1 (or w == 0 under Gemma's ``1 + w``) the weight multiply is
    exact, so a graph that moves it across a cast gives the same numbers; a
    random w makes such moved roundings show up in comparisons.
    """
    with torch.no_grad():
        for module in model.modules():
            if "Norm" in type(module).__name__ and isinstance(getattr(module, "weight", None), torch.Tensor):
                module.weight.add_(0.1 * torch.randn(module.weight.shape, generator=gen))


def build_model(
    name: str,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    seq_len: int = 8,
    layers: int | None = None,
    vocab_size: int | None = None,
) -> tuple[torch.nn.Module, tuple]:
    """Build a tiny model by name and example inputs for it.

    Returns ``(module, inputs)``: ``module(*inputs)`` gives logits of shape
    ``(1, seq_len, vocabulary)``. Inputs are int64 token ids ``(1, seq_len)``; T5 also
    takes decoder token ids of the same shape. Weights are the default HF
    random init under ``torch.manual_seed(seed)``, the module is in eval mode
    and converted with ``.to(dtype)``, so each norm keeps its own casts. Norm
    weights are the HF init plus N(0, 0.1) noise (see ``jitter_norm_weights``).
    ``layers`` replaces the config's number of layers (2; for T5, in the
    encoder and in the decoder), ``vocab_size`` its vocabulary (128).
    """
    spec = _SPECS.get(name)
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}")
    import transformers

    values = spec.config if layers is None else _with_layers(spec.config, layers)
    if vocab_size is not None:
        values = {**values, "vocab_size": vocab_size}
    config = getattr(transformers, spec.config_cls)(**values)
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model_cls)(config)
    gen = torch.Generator().manual_seed(seed)
    jitter_norm_weights(model, gen)
    module = _LogitsOnly(model).eval().to(dtype)

    # Ids from 3 up avoid the pad/bos/eos ids (0..2).
    ids = torch.randint(3, config.vocab_size, (1, seq_len), generator=gen, dtype=torch.int64)
    if spec.seq2seq:
        dec = torch.randint(3, config.vocab_size, (1, seq_len), generator=gen, dtype=torch.int64)
        return module, (ids, dec)
    return module, (ids,)


def _with_layers(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """``config`` with ``layers`` layers (a per-layer ``layer_types`` list repeats its pattern)."""
    if layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    values = {**config, **{k: layers for k in ("num_hidden_layers", "num_layers", "num_decoder_layers") if k in config}}
    if "layer_types" in config:
        pattern = config["layer_types"]
        values["layer_types"] = [pattern[i % len(pattern)] for i in range(layers)]
    return values
