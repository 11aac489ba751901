"""The exact reference: a float module computed in float64 throughout, even where it casts inside."""

from __future__ import annotations

import copy

import torch

from edgefuse.models import build_model
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


def test_a_whole_model_runs_in_float64_and_is_left_unchanged():
    module, example = build_model("tiny-qwen3", torch.float32, 0)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    logits = exact_module(module)(*example)
    assert logits.dtype == torch.float64 and bool(torch.isfinite(logits).all())
    with torch.no_grad():
        eager = module(*example)
    assert float((logits - eager.double()).abs().max()) < 1e-3 * float(logits.abs().max())
    assert all(torch.equal(before[k], v) and v.dtype == torch.float32 for k, v in module.state_dict().items())
