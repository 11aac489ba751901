"""The exact reference: a float module computed in float64 throughout, even where it casts inside."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from edgefuse.inputs.models import build_model
from edgefuse.quant.exact import exact_module


def test_a_norm_that_computes_in_float32_is_computed_in_float64():
    """Hugging Face Llama's norm upcasts to float32 whatever its input: ``.double()`` alone leaves its
    result float32-accurate (about 1e-7 off); the exact module matches the formula in float64."""
    module, _ = build_model("tiny-llama", torch.bfloat16, 0)
    norm = module.get_submodule("model.model.layers.0.input_layernorm")
    x = torch.randn(2, 5, norm.weight.shape[0], generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    h = x.double()
    formula = norm.weight.double() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
    exact = exact_module(norm)(x)
    assert exact.dtype == torch.float64
    assert float((exact - formula).abs().max()) <= 4 * torch.finfo(torch.float64).eps * float(formula.abs().max())
    assert float((copy.deepcopy(norm).double()(h) - formula).abs().max()) > 1e-9  # what the mode is for


class FloatDtypes(TorchDispatchMode):
    """Records the dtype of every floating tensor each op reads or produces."""

    def __init__(self):
        super().__init__()
        self.seen: dict[torch.dtype, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in tree_flatten((args, kwargs, result))[0]:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                self.seen.setdefault(value.dtype, str(func))
        return result


@pytest.mark.parametrize("name, dtype", [("tiny-llama", torch.bfloat16), ("tiny-qwen3", torch.float32),
                                         ("tiny-gemma3", torch.bfloat16), ("tiny-t5", torch.float16)])
def test_every_floating_tensor_of_a_whole_model_is_float64(name, dtype):
    """Every op of the model (rotary embeddings, masks, softmax, T5's position buckets) reads and makes
    float64 only; the model itself is left as it was."""
    module, example = build_model(name, dtype, 0)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    exact, recorder = exact_module(module), FloatDtypes()
    with recorder:
        logits = exact(*example)
    assert logits.dtype == torch.float64 and bool(torch.isfinite(logits).all())
    assert set(recorder.seen) == {torch.float64}, recorder.seen
    assert torch.get_default_dtype() == torch.float32
    assert all(torch.equal(before[k], v) and v.dtype == dtype for k, v in module.state_dict().items() if v.is_floating_point())


class ScaledByAFactory(torch.nn.Module):
    """Multiplies by a tensor made with no dtype (the default one) and one made in float32."""

    def forward(self, x):
        return x * torch.full(x.shape, 0.1) + torch.arange(x.shape[-1], dtype=torch.float32) / 3


def test_factories_make_float64_whether_or_not_they_are_given_a_dtype():
    x = torch.randn(2, 5)
    exact = exact_module(ScaledByAFactory())(x)
    formula = x.double() * 0.1 + torch.arange(5, dtype=torch.float64) / 3
    assert exact.dtype == torch.float64 and torch.equal(exact, formula)
