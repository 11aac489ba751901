"""The eager model an ``export_llm`` config describes, and the logits of a prefill and decode steps.

The reference for an exported LLM: :func:`eager_model` builds the module ``export_llm`` exports (the
same loading, source transforms, quantization and dtype, through ``export_llama_lib``'s own
preparation), and :func:`logits_sequence` runs any program, eager or loaded, through the same prompt
and decode steps. :func:`write_small_model` writes params and a random checkpoint for small models
(a model without a checkpoint reads uninitialised memory), such as those of :mod:`edgefuse.llm.small`.
:func:`norms_removed` makes every norm built within it normalize nothing, for the program a norm's cost is
measured against (:mod:`edgefuse.tools.scale`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from typing import Callable, Iterator, Sequence

import torch


def write_small_model(directory: str, params: dict, seed: int = 0, tied: bool = False) -> tuple[str, str]:
    """Write ``params.json`` and ``checkpoint.pth`` (random weights of ExecuTorch's Llama with ``params``;
    norm weights near 1) in ``directory``; returns their paths. With ``tied`` the output projection is the
    token embedding, one tensor saved once, as models that tie their embeddings (Qwen3, Llama 3.2) load it.
    The model is built on the meta device: only the checkpoint's own tensors take memory."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    with torch.device("meta"):
        model = construct_transformer(ModelArgs(**params))
    state = random_state(model, seed)
    if tied:
        state["output.weight"] = state["tok_embeddings.weight"]
    params_path, checkpoint_path = os.path.join(directory, "params.json"), os.path.join(directory, "checkpoint.pth")
    with open(params_path, "w") as f:
        json.dump(params, f)
    torch.save(state, checkpoint_path)
    return params_path, checkpoint_path


def write_token_tokenizer(directory: str, vocab: int) -> str:
    """Write ``tokenizer.json`` in ``directory``: a word-level Hugging Face tokenizer whose words
    ``t0 ... t{vocab - 1}``, joined by ``_`` (a command line's override takes no space), are the token
    ids ``0 ... vocab - 1``, and no end-of-text token. export_llm's
    own calibration (``quantization.calibration_data``, ``base.tokenizer_path``) then runs a small model
    on the tokens :func:`token_text` writes; returns the path."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import CharDelimiterSplit

    tokenizer = Tokenizer(WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tokenizer.pre_tokenizer = CharDelimiterSplit("_")
    path = os.path.join(directory, "tokenizer.json")
    tokenizer.save(path)
    return path


def token_text(tokens: torch.Tensor) -> str:
    """The text :func:`write_token_tokenizer`'s tokenizer reads as ``tokens``."""
    return "_".join(f"t{int(t)}" for t in tokens.reshape(-1))


def random_state(model: torch.nn.Module, seed: int = 0) -> dict:
    """A random float32 state dict for ``model``: norm weights ``1 + 0.1 N(0, 1)``, other weights
    ``N(0, 1) / sqrt(fan_in)`` (logits of order one); tensors that are not floats kept."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, value in model.state_dict().items():
        if not value.is_floating_point():
            state[name] = value
            continue
        noise = torch.randn(value.shape, generator=generator, dtype=torch.float32)
        state[name] = 1.0 + 0.1 * noise if "norm" in name else noise * value.shape[-1] ** -0.5
    return state


def eager_model(config) -> torch.nn.Module:
    """The module ``export_llm`` exports for ``config`` (an ``LlmConfig``), in eval mode; the config is
    not changed."""
    from executorch.examples.models.llama.export_llama_lib import _prepare_for_llama_export

    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (eager kernels of the custom SDPA)

    return _prepare_for_llama_export(copy.deepcopy(config)).model.eval()


@contextlib.contextmanager
def norms_removed() -> Iterator[None]:
    """Within the block, every ExecuTorch ``RMSNorm`` (the class ``export_llm``'s Llama and Qwen3 build their
    norms from) multiplies its input by its weight and normalizes nothing: no cast, mean or ``rsqrt`` is
    left of it. A program exported within the block runs everything but the norms' own work, the floor a
    lowering of the norms is measured against. The class is put back on leaving."""
    from executorch.examples.models.llama.norm import RMSNorm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = 1.0 + self.weight.float() if self.add_unit_offset else self.weight
        return x * weight.type_as(x)

    original = RMSNorm.forward
    RMSNorm.forward = forward
    try:
        yield
    finally:
        RMSNorm.forward = original


def eager_step(model: torch.nn.Module) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """One call of ``model`` as the exported program takes it: tokens ``[1, n]`` from position ``p``."""

    def step(tokens: torch.Tensor, position: int) -> torch.Tensor:
        with torch.no_grad():
            out = model(tokens, {"input_pos": torch.tensor([position], dtype=torch.long)})
        return out[0] if isinstance(out, tuple) else out

    return step


def prompt_and_steps(vocab: int, prefill: int, decode: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A random prompt ``[1, prefill]`` and ``decode`` single tokens ``[decode, 1, 1]``."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, prefill), generator=generator, dtype=torch.long)
    steps = torch.randint(0, vocab, (decode, 1, 1), generator=generator, dtype=torch.long)
    return prompt, steps


def logits_sequence(step: Callable[[torch.Tensor, int], torch.Tensor], prompt: torch.Tensor,
                    steps: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The logits of the prefill of ``prompt`` at position 0, then of each decode step after it."""
    result = [step(prompt, 0)]
    for i, token in enumerate(steps):
        result.append(step(token, prompt.shape[1] + i))
    return result


def config_from_overrides(overrides: Sequence[str]):
    """The ``LlmConfig`` that ``export_llm``'s overrides ``key=value`` make of the defaults, validated
    as export_llm validates (its dataclass checks run)."""
    from omegaconf import OmegaConf

    from executorch.extension.llm.export.config.llm_config import LlmConfig

    merged = OmegaConf.merge(OmegaConf.structured(LlmConfig), OmegaConf.from_dotlist(list(overrides)))
    return OmegaConf.to_object(merged)
