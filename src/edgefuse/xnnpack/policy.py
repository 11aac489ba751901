"""When a mean is worth delegating: the single-row policy.

A delegated mean is much faster than the portable kernel once it averages many rows; a mean of a
single row (one token of decode through an RMSNorm) has little work to save, so whether to delegate it
is a measured choice. ``python -m edgefuse.tools.xnnpack_bench`` measures it. On the shared 2-core x86
machine the project is measured on, at 1 thread, median CPU time of the program alone over 1000
rounds in random order (100-200 for the 2048-wide blocks), edgefuse against stock, load average 2-3.5
from other work:

=========================================  ============  ========
one row                                    ``delegate``  ``auto``
=========================================  ============  ========
float32 mean over 2048                     0.97          0.96
float32 RMSNorm over 2048                  0.87          0.87
float16 RMSNorm over 2048                  0.44          0.45
float32 RMSNorm then Linear(512)           0.99          1.00
float16 RMSNorm then Linear(512)           0.89          0.90
float32 4 pre-norm blocks over 2048        1.00          0.99
float16 4 pre-norm blocks over 2048        0.84          0.87
float32 4 pre-norm blocks over 512         0.97          0.99
float16 4 pre-norm blocks over 512         0.83          0.87
=========================================  ============  ========

Over 2048 values both policies delegate the mean (averaged in lanes, see :mod:`edgefuse.xnnpack.mean_plan`)
and differ only by noise; over 512, ``auto`` keeps the float32 mean of a Hugging Face norm (which
upcasts first) on the portable kernel, which splits the delegate around each norm (5 delegates instead
of 1 for four blocks) and measured no faster. So the default delegates every mean.

Policies, for a mean whose row count (the product of the kept dims) is static and equal to 1:

- ``"delegate"`` (default): delegate it like every other mean.
- ``"auto"``: leave a float32 single row on the portable kernel unless it is averaged in lanes
  (:func:`~edgefuse.xnnpack.mean_plan.lanes_for`: 1024 values or more that 8, 16 or 32 lanes divide);
  delegate float16 and bfloat16 ones.
- ``"float32-portable"``: leave every float32 single-row mean on the portable kernel; delegate float16
  and bfloat16 ones, whose neighbouring casts would otherwise split the delegate.
- ``"portable"``: leave every single-row mean on the portable kernel.

A mean whose row count is known only at run time (dynamic shapes) is always delegated: the same program
then serves prefill and decode, and prefill is where the time goes. At a decode step such a mean has
one row, and at width 128 delegating it measured no loss: in ExecuTorch's Llama at dim 128, 2 layers,
8da4w (5 norms; ``python -m edgefuse.tools.llm_latency --sizes 128x2 --dtypes 8da4w --rounds 1000
--repeats 2``), the fully-connected that averages a row of 128 took about 0.19 µs a call in samples of
decode steps (``perf record -F 10000 -e cpu-clock``; its loop is one chain of 128 dependent multiply-adds
into one register) against 0.15 to 0.17 µs for the portable kernel of stock's program, but stock's
portable means split its delegates: each of its decode steps makes 24 delegate calls to edgefuse's 19.
edgefuse's decode step took 0.998 of stock's (0.992 to 1.003 by run; six runs of 1,000 rounds, each
program loaded first in three), its prefill 0.997: no measurable difference. What a policy other than
``"delegate"`` costs: each mean it keeps portable splits the delegate around it, one more delegate
call per norm, and "no mean left outside the delegate" then holds only for means of more than one row.
"""

from __future__ import annotations

import torch

from edgefuse.xnnpack.mean_plan import MIN_SINGLE_ROW_LANES_WIDTH, lanes_for

SINGLE_ROW_POLICIES = ("auto", "delegate", "float32-portable", "portable")
DEFAULT_SINGLE_ROW_POLICY = "delegate"


def check_policy(policy: str) -> str:
    """``policy`` if it is one of :data:`SINGLE_ROW_POLICIES`; a ValueError naming them otherwise."""
    if policy not in SINGLE_ROW_POLICIES:
        raise ValueError(f"unknown single_row policy {policy!r}: choose one of {', '.join(SINGLE_ROW_POLICIES)}")
    return policy


def keep_portable(policy: str, rows: int | None, dtype: torch.dtype, width: int | None = None) -> str | None:
    """Why ``policy`` leaves a mean of ``rows`` rows of ``width`` values in ``dtype`` outside the delegate,
    or None. ``width`` None means it is not static (or not given)."""
    if rows != 1 or policy == "delegate":
        return None
    if policy == "portable":
        return f"single-row mean left on the portable kernel by the {policy!r} policy"
    if dtype != torch.float32:
        return None
    if policy == "auto":
        if lanes_for(width, rows) is not None:
            return None
        return (
            f"single-row float32 mean of {width if width is not None else 'a run-time number of'} values left "
            f"on the portable kernel by the 'auto' policy (delegated from {MIN_SINGLE_ROW_LANES_WIDTH} values "
            f"that 8, 16 or 32 lanes divide)"
        )
    return f"single-row mean left on the portable kernel by the {policy!r} policy"
