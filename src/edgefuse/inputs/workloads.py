"""The modules ``python -m edgefuse.tools.xnnpack_bench`` times: a mean over the last dim, Hugging Face
Llama's RMSNorm, a norm before a linear, blocks of those, and the blocks' linears alone (the floor no
lowering of the norms goes below)."""

from __future__ import annotations

import torch
from torch import nn

EPS = 1e-6


class LastDimMean(nn.Module):
    """A mean over the last dim, keeping it: the reduction of every RMSNorm, alone."""

    def __init__(self, width: int):
        super().__init__()

    def forward(self, x):
        return x.mean(-1, keepdim=True)


class LlamaRMSNorm(nn.Module):
    """Hugging Face Llama's RMSNorm, as transformers 5 writes it."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(width))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(x.dtype)


class NormLinear(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = LlamaRMSNorm(width)
        self.linear = nn.Linear(width, width, bias=False)

    def forward(self, x):
        return self.linear(self.norm(x))


class Blocks(nn.Module):
    def __init__(self, width: int, count: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(NormLinear(width) for _ in range(count))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


class Linears(nn.Module):
    """``Blocks`` without their norms, sharing their linears: ``x + Linear(x)`` four times."""

    def __init__(self, blocks: Blocks):
        super().__init__()
        self.linears = nn.ModuleList(block.linear for block in blocks.blocks)

    def forward(self, x):
        for linear in self.linears:
            x = x + linear(x)
        return x
