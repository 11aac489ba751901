"""RMSNorm as real models and hand-written code spell it, and near misses that are not one."""

from __future__ import annotations

import torch
from torch import nn

EPS = 1e-6


def _weight(dim: int, dtype: torch.dtype | None = None, around: float = 1.0) -> nn.Parameter:
    generator = torch.Generator().manual_seed(dim)
    return nn.Parameter(around + 0.5 * torch.randn(dim, generator=generator, dtype=torch.float32).to(dtype or torch.float32))


class LlamaNorm(nn.Module):
    """Hugging Face Llama / Qwen / Mistral: upcast, normalize, cast back, then the weight."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(x.dtype)


class ExecuTorchLlamaNorm(nn.Module):
    """ExecuTorch's Llama example: ``x * x``, ``.float()`` and ``type_as``."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def _norm(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


class T5Norm(nn.Module):
    """T5: the variance of a float32 copy scales the original tensor; half weights cast it back."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + EPS)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return self.weight * x


class Olmo2Norm(nn.Module):
    """OLMo2: the weight applied in float32, then one cast back."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return (self.weight * h).to(x.dtype)


class GemmaNorm(nn.Module):
    """Gemma: ``* (1 + w.float())`` in float32, cast back at the end."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim, around=0.0)

    def forward(self, x):
        output = x.float()
        output = output * torch.rsqrt(output.pow(2).mean(-1, keepdim=True) + EPS)
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class Gemma3nNorm(nn.Module):
    """Gemma 3n and Gemma 4: the root as ``pow(mean + eps, -0.5)``, the weight in float32, cast at the end."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + EPS, -0.5)
        return (h * self.weight.float()).type_as(x)


class ScalelessNorm(nn.Module):
    """ExecuTorch's ``ScalelessRMSNorm``: no weight."""

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).type_as(x)


class DivSqrtNorm(nn.Module):
    """Written by hand: ``x / sqrt(mean + eps)``, weight on the left."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        return self.weight * (x / torch.sqrt(x.pow(2.0).mean(-1, keepdim=True) + EPS))


class DivPowSqrtNorm(nn.Module):
    """Written by hand: ``x / (mean + eps) ** 0.5``."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        return self.weight * (x / (x.pow(2).mean(-1, keepdim=True) + EPS) ** 0.5)


class ReciprocalSqrtNorm(nn.Module):
    """Written by hand: ``x * reciprocal(sqrt(...))`` with ``square``."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        return x * torch.reciprocal(torch.sqrt(torch.square(x).mean(-1, keepdim=True) + EPS)) * self.weight


class ReciprocalPowSqrtNorm(nn.Module):
    """Written by hand: ``x * reciprocal((mean + eps) ** 0.5)``."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        return x * torch.reciprocal((x.pow(2).mean(-1, keepdim=True) + EPS) ** 0.5) * self.weight


class RsqrtLeftNorm(nn.Module):
    """``rsqrt(...) * x`` with the eps added on the left and the weight on the right."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        return (EPS + x.pow(2).mean(-1, keepdim=True)).rsqrt() * x * self.weight


class FunctionalNorm(nn.Module):
    """``torch.nn.functional.rms_norm``, which edge graphs decompose."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, EPS)


# Near misses: each computes something that is not rms_norm of one tensor.


class DifferentScaled(nn.Module):
    """Scales ``y`` by the norm of ``x``."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x, y):
        return self.weight * (y * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


class Cube(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True) + EPS)


class ProductOfTwo(nn.Module):
    def forward(self, x, y):
        return x * torch.rsqrt((x * y).mean(-1, keepdim=True) + EPS)


class WrongDim(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + EPS)


class NoKeepdim(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1) + EPS).unsqueeze(-1)


class LaterMul(nn.Module):
    """A weightless norm, a cast, then a multiply by ``s``: a scalar, a 0-d constant or a tensor."""

    def __init__(self, s):
        super().__init__()
        self.s = s

    def forward(self, x):
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).type_as(x)
        return h * self.s


class NormThenScale(nn.Module):
    """A Llama norm (with its weight) followed by a multiply by a parameter of the normalized shape."""

    def __init__(self, dim: int = 16, scale_dtype: torch.dtype | None = None):
        super().__init__()
        self.norm = LlamaNorm(dim)
        self.scale = _weight(dim + 1, scale_dtype)[:dim].detach()

    def forward(self, x):
        return self.norm(x) * self.scale.to(x.device)


class RoundThenNorm(nn.Module):
    """float32 in, rounded to float16, back to float32, normalized in float32."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.norm = LlamaNorm(dim)

    def forward(self, x):
        return self.norm(x.to(torch.float16).to(torch.float32))


class RoundInsideNorm(nn.Module):
    """float32 in and out, but the normalized tensor is rounded to float16 before the weight."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(torch.float16).to(torch.float32)


class ContiguousUpcastNorm(nn.Module):
    """A channels-last input upcast with ``memory_format=contiguous``: the cast changes the dim order."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.weight = _weight(dim)

    def forward(self, x):
        h = x.to(torch.float32, memory_format=torch.contiguous_format)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(x.dtype)


class GroupedNorm(nn.Module):
    """Mamba2's gated norm: groups of ``dim // groups`` normalized, merged back, then a full-width weight."""

    def __init__(self, dim: int = 16, groups: int = 4):
        super().__init__()
        self.groups = groups
        self.weight = _weight(dim)

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        *lead, width = h.shape
        h = h.view(*lead, self.groups, width // self.groups)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        h = h.view(*lead, width)
        return self.weight * h.to(dtype)


#: The hand-written modules of forms of the registry (``edgefuse.core.forms.FORMS``), by its names: the form
#: tests build these as models write them, and the registry's other forms from the registry itself.
WRITTEN = {
    "llama": LlamaNorm,
    "executorch-llama": ExecuTorchLlamaNorm,
    "t5": T5Norm,
    "olmo2": Olmo2Norm,
    "gemma": GemmaNorm,
    "gemma3n": Gemma3nNorm,
    "scaleless": ScalelessNorm,
    "div-sqrt": DivSqrtNorm,
    "div-pow-sqrt": DivPowSqrtNorm,
    "reciprocal-sqrt": ReciprocalSqrtNorm,
    "reciprocal-pow-sqrt": ReciprocalPowSqrtNorm,
    "rsqrt-left": RsqrtLeftNorm,
    "functional": FunctionalNorm,
}
