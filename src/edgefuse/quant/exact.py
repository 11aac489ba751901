"""The exact value of what a float module computes: the module run in float64 throughout.

``module.double()`` alone is not exact for models that cast inside: a Hugging Face norm computes in
float32 whatever its weights (``hidden_states.to(torch.float32)``), and softmax is asked for in
float32. Under :class:`Float64Throughout` every op asked for a narrower floating dtype gets float64, and
factories with no dtype make float64 (the default dtype), so the module's own formula is evaluated with
no rounding but float64's. Its weights and buffers are the module's own values, widened: a bfloat16
model's buffers (rotary frequencies, Gemma's embedding scale) keep the values bfloat16 gave them.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

#: The floating dtypes an op is not allowed to produce inside :class:`Float64Throughout`.
NARROWER = (torch.float32, torch.float16, torch.bfloat16)


class Float64Throughout(TorchDispatchMode):
    """Dispatch mode that replaces a narrower floating ``dtype`` keyword of any op with float64 (casts,
    factories and reductions given a ``dtype``): a float64 computation stays float64."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("dtype") in NARROWER:
            kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


def exact_module(module: torch.nn.Module) -> Callable[..., Any]:
    """A function computing ``module``'s outputs exactly: a float64 copy of it, run under
    :class:`Float64Throughout` on its inputs with floating tensors made float64."""
    twin = copy.deepcopy(module).double().eval()

    def wide(value: Any) -> Any:
        return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    def run(*args: Any) -> Any:
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            with torch.no_grad(), Float64Throughout():
                return twin(*tree_map(wide, args))
        finally:
            torch.set_default_dtype(default)

    return run
