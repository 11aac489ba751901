"""The eps values a rebuilt norm may carry: zero only where the model adds an eps that is zero there."""

from __future__ import annotations

import dataclasses

import torch

from edgefuse.fuzz.spec import CastSpec, NormSpec


def test_eps_zero_is_allowed_only_where_the_model_adds_an_eps_that_is_zero_there():
    from edgefuse.fuzz.tolerance import eps_values

    f32 = NormSpec("llama", pre=(CastSpec("to", "float32"),), eps=1e-8)
    assert 0.0 not in eps_values(f32, "float16")  # 1e-8 is 0 in float16, but this norm adds it in float32
    assert 1e-8 in eps_values(f32, "float16") and float(torch.tensor(1e-8)) in eps_values(f32, "float16")
    half = NormSpec("llama", pre=(CastSpec("to", "input"),), eps=1e-12)
    assert 0.0 in eps_values(half, "float16")  # added in float16, where it is 0
    const = NormSpec("llama", eps=1e-12, eps_how="const", eps_dtype="float64")
    assert 0.0 not in eps_values(const, "float16")  # a float64 [1] tensor promotes the sum to float64
    assert 0.0 in eps_values(dataclasses.replace(const, eps_dtype="float16"), "float32")  # stored as 0

