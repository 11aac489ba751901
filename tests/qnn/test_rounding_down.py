"""A converted module run with its norms' outputs rounding down, as QNN's RmsNorm rounds them: only the
quantize ops of ``rms_norm`` outputs change, from the nearest level to the one at or below."""

from __future__ import annotations

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

from edgefuse.qnn.emulator import rms_norm_roundings, rounding_down

OPS = torch.ops.quantized_decomposed
STEP = 0.01


def _fake_quantized(value: torch.Tensor) -> torch.Tensor:
    q = OPS.quantize_per_tensor.default(value, STEP, 0, -128, 127, torch.int8)
    return OPS.dequantize_per_tensor.default(q, STEP, 0, -128, 127, torch.int8)


class NormBesideProduct(torch.nn.Module):
    """A quantized norm and a quantized product of the same input."""

    def forward(self, x, weight):
        norm = torch.ops.aten.rms_norm.default(x, [8], weight, 1e-6)
        return _fake_quantized(norm), _fake_quantized(x * 0.37)


def _inputs():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(3, 8, generator=generator), 1 + 0.1 * torch.randn(8, generator=generator)


def test_only_the_norm_output_rounds_down():
    converted = torch.fx.symbolic_trace(NormBesideProduct())
    x, weight = _inputs()
    norms = rms_norm_roundings(converted)
    assert [str(node.args[0].target) for node in norms] == ["aten.rms_norm.default"]

    norm, product = rounding_down(converted, norms)(x, weight)
    exact = torch.ops.aten.rms_norm.default(x, [8], weight, 1e-6)
    assert torch.equal(norm, torch.floor(exact / STEP).clamp(-128, 127) * STEP)
    nearest_norm, nearest_product = converted(x, weight)
    assert torch.equal(product, nearest_product)  # the other quantize still rounds to the nearest level
    assert (norm < nearest_norm).any() and (norm <= nearest_norm).all()


def test_without_quantizes_to_round_down_it_is_the_module():
    converted = torch.fx.symbolic_trace(NormBesideProduct())
    x, weight = _inputs()
    for got, expected in zip(rounding_down(converted, [])(x, weight), converted(x, weight)):
        assert torch.equal(got, expected)
