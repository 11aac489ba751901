"""Models that ExecuTorch's QNN flow lowers whole: ExecuTorch's own Llama, and one decoder layer of a tiny model.

Whole transformers models do not lower through QNN's flow for reasons of their own mask code (an
``index.Tensor`` gather of the wrong rank, an integer ``cumsum``), so for the transformers families
this builds one decoder layer, with what the model would compute around it made inputs: the hidden
states, the additive causal mask and the rotary ``cos``/``sin`` of the model's own rotary embedding (T5:
its relative position bias, mask included). ExecuTorch's ``Transformer`` (no KV cache, tokens in) lowers
whole. Weights are random, seeded; norm weights get the same jitter as :mod:`edgefuse.inputs.models`, so a
rewrite that moves a weight across a rounding shows up.

Names: ``et-llama[-qk]-hd32|hd64``, ``tiny-<family>-layer`` and ``whole-qk[-bhsd]-hd<D>-s<S>`` (an
attention block whose norms are ``torch.nn.RMSNorm``, prefilling S tokens; see :data:`QNN_MODEL_NAMES`).
"""

from __future__ import annotations

import inspect

import torch

#: ExecuTorch's Llama: (QK norms, head dim) per name. One layer (QNN's flow exports a model several
#: times: each layer costs seconds), dim 128, the logits of every position.
_ET_LLAMA = {
    "et-llama-hd32": (False, 32),
    "et-llama-qk-hd32": (True, 32),
    "et-llama-hd64": (False, 64),
    "et-llama-qk-hd64": (True, 64),
}
#: The tiny transformers model each ``-layer`` name takes its first decoder layer from.
_LAYERS = {f"{name}-layer": name for name in ("tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-olmo2", "tiny-t5")}

#: Attention blocks whose norms are whole ``torch.nn.RMSNorm``: (head dim, tokens, QK norms on
#: ``[B, heads, S, D]`` as the static Llama of ExecuTorch's QNN examples has them, else on ``[B, S, heads, D]``).
_WHOLE = {
    "whole-qk-hd32-s16": (32, 16, False),
    "whole-qk-bhsd-hd32-s16": (32, 16, True),
    "whole-qk-hd64-s16": (64, 16, False),
    "whole-qk-hd64-s128": (64, 128, False),
    "whole-qk-hd128-s16": (128, 16, False),
    "whole-qk-hd128-s128": (128, 128, False),
}
QNN_MODEL_NAMES: tuple[str, ...] = (*_ET_LLAMA, *_LAYERS, *_WHOLE)
SEQ_LEN = 16
#: What the mask adds where a token may not look. Softmax gives it nothing: e^-60 (1e-26) of a visible
#: token's weight is below float32's resolution next to 1 and underflows in float16, while these
#: models' scores stay within about 10 of each other. And it is no larger: quantized, the mask's range
#: is the range of the scores it is added to, so -1e4 put their 16-bit step at 0.15 (a level moved by
#: the HTP then moved a layer's output by 1000 of its steps), where -60 puts it at 9e-4.
MASKED = -60.0
#: What ExecuTorch's own QNN Llama example adds where a token may not look (``PADDING_MASK_VALUE`` of
#: ``executorch/examples/qualcomm/oss_scripts/llama/masking_utils.py``, which cannot be imported alone:
#: its package imports models that need torchtune). Softmax gives e^-255 nothing either.
QNN_LLAMA_MASKED = -255.0


def build_qnn_model(
    name: str, dtype: torch.dtype = torch.float32, seed: int = 0, seq_len: int = SEQ_LEN
) -> tuple[torch.nn.Module, tuple]:
    """``(module, example_inputs)`` of the model ``name`` (one of :data:`QNN_MODEL_NAMES`), in eval mode."""
    if name in _ET_LLAMA:
        qk_norm, head_dim = _ET_LLAMA[name]
        return executorch_llama(qk_norm=qk_norm, head_dim=head_dim, dtype=dtype, seed=seed, seq_len=seq_len)
    if name in _LAYERS:
        return decoder_layer(_LAYERS[name], dtype=dtype, seed=seed, seq_len=seq_len)
    if name in _WHOLE:
        head_dim, tokens, heads_first = _WHOLE[name]
        return whole_norm_attention(head_dim, tokens, heads_first=heads_first, dtype=dtype, seed=seed)
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(QNN_MODEL_NAMES)}")


def executorch_llama(
    *, qk_norm: bool, head_dim: int, dtype: torch.dtype = torch.float32, seed: int = 0, seq_len: int = SEQ_LEN,
    dim: int = 128, layers: int = 1, vocab: int = 128,
) -> tuple[torch.nn.Module, tuple]:
    """The ``Transformer`` of ``executorch.examples.models.llama`` from small params: tokens in, the logits
    of every position out (no KV cache), with the additive float causal mask QNN's users give it
    (:func:`float_causal_mask`)."""
    if dim % head_dim:
        raise ValueError(f"head dim {head_dim} does not divide dim {dim}")
    heads = dim // head_dim
    params = dict(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=max(1, heads // 2), head_dim=head_dim,
                  vocab_size=vocab, hidden_dim=2 * dim, use_qk_norm=qk_norm, norm_eps=1e-5)
    return executorch_transformer(params, dtype=dtype, seed=seed, seq_len=seq_len)


def executorch_transformer(
    params: dict, *, dtype: torch.dtype = torch.float32, seed: int = 0, seq_len: int = SEQ_LEN,
) -> tuple[torch.nn.Module, tuple]:
    """ExecuTorch's ``Transformer`` of ``params`` (``ModelArgs`` fields, as an ``export_llm`` params file
    holds them) with random weights and jittered norm weights: tokens ``[1, seq_len]`` in, the logits of
    every position out (no KV cache), with the additive float causal mask of :func:`float_causal_mask`."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    from edgefuse.inputs.models import jitter_norm_weights

    context = max(64, seq_len)
    args = ModelArgs(**{**params, "max_seq_len": context, "max_context_len": context, "generate_full_logits": True})
    torch.manual_seed(seed)
    model = construct_transformer(args)
    gen = torch.Generator().manual_seed(seed)
    jitter_norm_weights(model, gen)
    float_causal_mask(model)
    tokens = torch.randint(0, args.vocab_size, (1, seq_len), generator=gen, dtype=torch.int64)
    return _Logits(model).eval().to(dtype), (tokens,)


def float_causal_mask(model: torch.nn.Module) -> None:
    """Put in place of each attention's boolean causal ``mask`` buffer the additive float mask ExecuTorch's
    own QNN Llama example builds: 0 where a token may look, :data:`QNN_LLAMA_MASKED` where it may not.

    As ExecuTorch ships it, the bool mask reaches QNN as -inf, which QNN clips to -65535: quantized at 16
    bits, the mask sets the range of the scores it is added to, whose step becomes 1.0, and a level the HTP
    lands on beside the fake-quantized module's then moves the logits by about 15,400 of their steps
    (measured on QNN 2.51's emulator, all four variants, 16a8w, stock's flow and edgefuse's alike). With
    this mask edgefuse's programs are 4.3e-4 to 5.8e-4 off the fake-quantized module, within the 1.3e-3
    to 2.0e-3 their roundings allow, so the 16a8w rows measure the norms, not the mask. In float32 eager
    the two masks give the same logits, bit for bit.
    """
    for module in model.modules():
        mask = module._buffers.get("mask")
        if mask is not None and mask.dtype == torch.bool:
            module._buffers["mask"] = torch.zeros(mask.shape).masked_fill(~mask, QNN_LLAMA_MASKED)


class _Logits(torch.nn.Module):
    """Calls ExecuTorch's ``Transformer`` on tokens alone and returns its logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.model(tokens)
        return out[0] if isinstance(out, tuple) else out


class _DecoderLayer(torch.nn.Module):
    """One transformers decoder layer with its mask and rotary embedding as inputs; returns hidden states."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        out = self.layer(hidden, attention_mask=mask, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out


class _T5Block(torch.nn.Module):
    """T5's first encoder block with its relative position bias (mask included) as an input."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, hidden: torch.Tensor, position_bias: torch.Tensor) -> torch.Tensor:
        out = self.block(hidden, position_bias=position_bias)
        return out[0] if isinstance(out, tuple) else out


def decoder_layer(
    model_name: str, dtype: torch.dtype = torch.float32, seed: int = 0, seq_len: int = SEQ_LEN
) -> tuple[torch.nn.Module, tuple]:
    """The first decoder layer of the tiny model ``model_name`` (:func:`edgefuse.inputs.models.build_model`), with
    inputs: hidden states, and what the model computes for that layer from the positions."""
    from edgefuse.inputs.models import build_model

    wrapped, _ = build_model(model_name, dtype=torch.float32, seed=seed, seq_len=seq_len, layers=1)
    model = wrapped.model
    gen = torch.Generator().manual_seed(seed + 1)
    width = model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.d_model
    hidden = torch.randn((1, seq_len, width), generator=gen)
    causal = torch.full((seq_len, seq_len), MASKED).triu(1)
    if model_name == "tiny-t5":
        block = model.encoder.block[0]
        with torch.no_grad():
            bias = block.layer[0].SelfAttention.compute_bias(seq_len, seq_len)  # [1, heads, T, T]
        module, inputs = _T5Block(block), (hidden, bias + causal)
    else:
        decoder = model.model
        layer = decoder.layers[0]
        positions = torch.arange(seq_len).unsqueeze(0)
        with torch.no_grad():
            per_type = "layer_type" in inspect.signature(decoder.rotary_emb.forward).parameters  # Gemma3
            extra = (model.config.layer_types[0],) if per_type else ()
            cos, sin = decoder.rotary_emb(hidden, positions, *extra)
        module, inputs = _DecoderLayer(layer), (hidden, causal[None, None], cos, sin)
    module = module.eval().to(dtype)
    return module, tuple(t.to(dtype) for t in inputs)



class WholeNormAttention(torch.nn.Module):
    """One attention block whose norms are whole ``torch.nn.RMSNorm``: the input norm on ``[1, S, dim]`` and
    QK norms per head, on ``[1, S, heads, D]`` or, with ``heads_first``, on ``[1, heads, S, D]``; each
    reaches QNN as one ``aten.rms_norm``, which stock ExecuTorch sends as written."""

    def __init__(self, dim: int, head_dim: int, heads_first: bool) -> None:
        super().__init__()
        self.heads, self.head_dim, self.heads_first = dim // head_dim, head_dim, heads_first
        self.norm = torch.nn.RMSNorm(dim, eps=1e-6)
        self.q_norm, self.k_norm = torch.nn.RMSNorm(head_dim, eps=1e-6), torch.nn.RMSNorm(head_dim, eps=1e-6)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))

    def _heads(self, h: torch.Tensor, linear: torch.nn.Module, norm: torch.nn.Module | None) -> torch.Tensor:
        t = linear(h).view(h.shape[0], h.shape[1], self.heads, self.head_dim)
        if norm is None:
            return t.transpose(1, 2)
        return norm(t.transpose(1, 2)) if self.heads_first else norm(t).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        q, k, v = self._heads(h, self.q, self.q_norm), self._heads(h, self.k, self.k_norm), self._heads(h, self.v, None)
        scores = q @ k.transpose(-1, -2) / self.head_dim ** 0.5 + mask
        out = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(x.shape)
        return x + self.o(out)


def whole_norm_attention(
    head_dim: int, tokens: int, *, heads_first: bool = False, dtype: torch.dtype = torch.float32, seed: int = 0,
) -> tuple[torch.nn.Module, tuple]:
    """A :class:`WholeNormAttention` of 4 heads (2 at a head dim of 128) with random seeded weights, its
    norm weights jittered, and its inputs: hidden states of ``tokens`` tokens and the additive causal mask."""
    from edgefuse.inputs.models import jitter_norm_weights

    dim = 4 * head_dim if head_dim < 128 else 2 * head_dim
    torch.manual_seed(seed)
    module = WholeNormAttention(dim, head_dim, heads_first)
    gen = torch.Generator().manual_seed(seed)
    jitter_norm_weights(module, gen)
    hidden = torch.randn((1, tokens, dim), generator=gen)
    mask = torch.full((tokens, tokens), MASKED).triu(1)
    return module.eval().to(dtype), (hidden.to(dtype), mask.to(dtype))
