"""Run a model once without changing it: on copies of its inputs, with its buffers put back afterwards.

A model may write its inputs or its buffers in place (a counter, a cache, ``x.mul_(2)``). edgefuse runs
the same model several times to compare (eager, the unrewritten and the rewritten program, the ``.pte``),
and each run must see the inputs and state the first one saw, or the comparison measures the writes.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils import _pytree as pytree


def fresh(inputs: Any) -> Any:
    """``inputs`` with every tensor replaced by a copy of it."""
    return pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, inputs)


@contextlib.contextmanager
def kept_buffers(module: torch.nn.Module) -> Iterator[None]:
    """Put every buffer of ``module`` back to its value on entry when the block ends."""
    saved = [(buffer, buffer.detach().clone()) for buffer in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
