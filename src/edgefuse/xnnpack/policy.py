"""When a mean is worth delegating: the single-row policy.

A delegated mean is much faster than the portable kernel once it averages many rows, but a mean of a
single row (one token of decode through an RMSNorm) costs the same or a little more inside XNNPACK: the
portable kernel does the 2048 additions as fast as a ``FullyConnected`` of one row, and the delegate
pays per-node dispatch on top. ``python -m edgefuse.xnnpack.bench`` measures it. On the shared 2-core
x86 machine the project is measured on, at 1 thread, 1000 alternating runs, medians against stock:

======================================  ==========  ===================
one row                                 ``delegate``  default
======================================  ==========  ===================
float32 RMSNorm over 2048                1.03        0.96
float16 RMSNorm over 2048                0.56        0.53
float32 RMSNorm then Linear(512)         0.98        1.00
float32 4 pre-norm blocks over 512       0.90        0.78
float16 4 pre-norm blocks over 512       0.88        0.90
======================================  ==========  ===================

(earlier runs of the float32 RMSNorm gave 0.97-1.02 and 1.09-1.14 with the mean delegated), so the
delegated single-row mean buys nothing and sometimes costs a few percent; the noise between runs is
of the same size.

Policies, for a mean whose row count (the product of the kept dims) is static and equal to 1:

- ``"delegate"``: delegate it like every other mean.
- ``"float32-portable"`` (default): leave a float32 single-row mean on the portable kernel, where it is
  at least as fast; delegate float16 and bfloat16 ones, whose neighbouring casts and arithmetic would
  otherwise split the delegate (that split costs far more than the mean saves).
- ``"portable"``: leave every single-row mean on the portable kernel.

A mean whose row count is known only at run time (dynamic shapes) is always delegated: the same program
then serves prefill and decode, and prefill is where the time goes. The policy reads the dtype of the
mean itself: Hugging Face float16 norms upcast first, so their mean is float32 and the default keeps it
portable at one row while their casts are delegated.

What the default costs: a single-row (static decode) program keeps one portable mean per norm, which
splits the delegate around it (one more delegate call per norm, 5 delegates instead of 1 for four
blocks), and "no mean left outside the delegate" then holds only for programs with more than one row
per mean; ``single_row="delegate"`` restores it at the measured cost above.
"""

from __future__ import annotations

import torch

SINGLE_ROW_POLICIES = ("delegate", "float32-portable", "portable")
DEFAULT_SINGLE_ROW_POLICY = "float32-portable"


def check_policy(policy: str) -> str:
    """``policy`` if it is one of :data:`SINGLE_ROW_POLICIES`; a ValueError naming them otherwise."""
    if policy not in SINGLE_ROW_POLICIES:
        raise ValueError(f"unknown single_row policy {policy!r}: choose one of {', '.join(SINGLE_ROW_POLICIES)}")
    return policy


def keep_portable(policy: str, rows: int | None, dtype: torch.dtype) -> str | None:
    """Why ``policy`` leaves a mean of ``rows`` rows in ``dtype`` outside the delegate, or None."""
    if rows != 1 or policy == "delegate":
        return None
    if policy == "portable" or dtype == torch.float32:
        return f"single-row mean left on the portable kernel by the {policy!r} policy"
    return None
