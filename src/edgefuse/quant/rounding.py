"""What rounding a norm's mean another way does to a quantized model's outputs: its *rounding floor*.

edgefuse's only change to a norm is the order in which the delegate sums its mean of squares (for a wide row,
pooling then a fully-connected step over the lanes' means), which rounds that mean's last bits another way. In
float that stays within the dtype's bound; once activations are quantized, a last-bit change can move an int8
level, and layer after layer such steps spread. The floor is a sample of that, not a bound: the three
roundings of :data:`MEAN_ROUNDINGS`. It perturbs the norms alone; a program that also computes another op to its
last bits otherwise (Gemma 3's tanh GELU, with XNNPACK's tanh) is held to a floor that leaves that out, so the
allowance is smaller, never larger, than one that sampled both. :func:`means_rounded` makes
every norm of a model round its mean another way and nothing else; :func:`rounding_floor` measures how far
that moves the model's outputs. Both serve any model holding the norms of :data:`NORMS`, ExecuTorch's
(``export_llm``'s Llama and Qwen3) and transformers' (the models Hugging Face's exporter takes).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, Sequence

import torch

#: How :func:`means_rounded` rounds each norm's mean of squares: summed in float64 and rounded once to the
#: input's dtype, or torch's mean moved one unit in its last place up or down.
MEAN_ROUNDINGS = ("float64", "up", "down")

#: The norm classes :func:`means_rounded` knows, by module and class name, and the method it replaces: ``_norm``
#: (ExecuTorch's ``RMSNorm`` and Gemma 3's, whose ``forward`` casts to float32 around it) or ``forward``
#: (transformers' Llama form, whose ``forward`` computes the variance itself).
NORMS = (
    ("executorch.examples.models.llama.norm", "RMSNorm", "_norm"),
    ("transformers.models.gemma3.modeling_gemma3", "Gemma3RMSNorm", "_norm"),
    ("transformers.models.qwen3.modeling_qwen3", "Qwen3RMSNorm", "forward"),
    ("transformers.models.llama.modeling_llama", "LlamaRMSNorm", "forward"),
    ("transformers.models.smollm3.modeling_smollm3", "SmolLM3RMSNorm", "forward"),
)


def rounded_mean(x: torch.Tensor, rounding: str) -> torch.Tensor:
    """The mean of ``x``'s squares over its last dim (kept), rounded as ``rounding`` says (one of
    :data:`MEAN_ROUNDINGS`)."""
    if rounding == "float64":
        return (x.double() * x.double()).mean(-1, keepdim=True).to(x.dtype)
    mean = (x * x).mean(-1, keepdim=True)
    return torch.nextafter(mean, torch.full_like(mean, float("inf") if rounding == "up" else float("-inf")))


def _replacements(rounding: str) -> dict[str, Callable]:
    """Each replaced method of :data:`NORMS`: the class's own computation with its mean from :func:`rounded_mean`."""

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(rounded_mean(x, rounding) + self.eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = rounded_mean(hidden_states, rounding)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)

    return {"_norm": norm, "forward": forward}


def known_norms(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """Each norm of ``model`` that is one of :data:`NORMS`' classes (exactly: a subclass may compute otherwise),
    with the method :func:`means_rounded` replaces in it. A class whose module is not loaded has no instance."""
    classes = {}
    for module, name, method in NORMS:
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, name):
            classes[getattr(loaded, name)] = method
    return [(m, classes[type(m)]) for m in model.modules() if type(m) in classes]


@contextlib.contextmanager
def means_rounded(model: torch.nn.Module, rounding: str) -> Iterator[int]:
    """Within the block, each of ``model``'s norms (:data:`NORMS`) takes its mean of squares rounded another
    way (``rounding``, one of :data:`MEAN_ROUNDINGS`); the rest of the norm is unchanged, so it differs from
    the model's own by the rounding of that mean alone. Yields how many norms it changed; each is put back on
    leaving. A model holding none is refused (:class:`ValueError`): its floor would be 0 whatever it computes."""
    if rounding not in MEAN_ROUNDINGS:
        raise ValueError(f"rounding {rounding!r}: one of {', '.join(MEAN_ROUNDINGS)}")
    norms = known_norms(model)
    if not norms:
        raise ValueError(f"the model holds no norm means_rounded knows ({', '.join(name for _, name, _ in NORMS)}): "
                         "its rounding floor cannot be measured")
    replacements = _replacements(rounding)
    before = [m.__dict__.get(method) for m, method in norms]  # a block within another puts the outer's back
    for m, method in norms:
        setattr(m, method, replacements[method].__get__(m))
    try:
        yield len(norms)
    finally:
        for (m, method), kept in zip(norms, before):
            if kept is None:
                delattr(m, method)
            else:
                setattr(m, method, kept)


def rounding_floor(model: torch.nn.Module, outputs: Callable[[], Sequence[torch.Tensor]],
                   expected: Sequence[torch.Tensor]) -> list[float]:
    """For each of ``expected`` (``model``'s own outputs, as ``outputs()`` computes them: a step's logits each),
    the largest difference from it of ``outputs()`` with every norm's mean rounded another way, the most over
    :data:`MEAN_ROUNDINGS`. Whether a last-bit change moves an activation to another int8 level is chance (in
    the small Qwen3 of width 1024 and 4 layers, over 8 prompt tokens and 4 decode steps, the float64 sum moved
    the logits by at most 1e-6, by up to 0.018 over 10 and 12; one unit up by 0.044 to 0.060; one unit down by
    6e-7 at the prompt and 0.037 to 0.088 after), so the floor takes the most of three."""
    from edgefuse.core.verify import max_error

    floor = [0.0] * len(expected)
    for rounding in MEAN_ROUNDINGS:
        with means_rounded(model, rounding):
            moved = outputs()
        floor = [max(f, max_error(e, m)) for f, e, m in zip(floor, expected, moved)]
    return floor
