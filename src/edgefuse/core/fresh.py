"""Run a model once without changing it: on copies of its inputs, with its state put back afterwards.

A model may write its inputs, buffers or parameters in place (a counter, a cache, ``x.mul_(2)``). edgefuse runs
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
def kept_state(module: torch.nn.Module) -> Iterator[None]:
    """Put every buffer and parameter of ``module`` back to its value on entry when the block ends.

    Take copies of outputs inside the block (:func:`fresh`): an output may be a buffer itself.
    """
    saved = [(tensor, tensor.detach().clone()) for tensor in (*module.buffers(), *module.parameters())]
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)
