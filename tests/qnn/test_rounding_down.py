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


class NormPerChannel(torch.nn.Module):
    """A norm whose output is quantized per channel beside one quantized per tensor."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scales", torch.full((8,), STEP))
        self.register_buffer("zero_points", torch.zeros(8, dtype=torch.long))

    def forward(self, x, weight):
        norm = torch.ops.aten.rms_norm.default(x, [8], weight, 1e-6)
        per_channel = OPS.quantize_per_channel.default(norm, self.scales, self.zero_points, 1, -128, 127, torch.int8)
        return per_channel, _fake_quantized(norm)


def test_a_norm_output_quantized_per_channel_is_not_one_to_round_down():
    """:func:`rounding_down` reads a per-tensor op's scale, zero point, range and dtype; a per-channel op's
    arguments in those places are its scales, zero points, axis and range."""
    converted = torch.fx.symbolic_trace(NormPerChannel())
    assert [str(node.target) for node in rms_norm_roundings(converted)] == ["quantized_decomposed.quantize_per_tensor.default"]


class NormQuantizedByKeyword(torch.nn.Module):
    """A norm whose output's quantize op gets its range and dtype by keyword."""

    def forward(self, x, weight):
        norm = torch.ops.aten.rms_norm.default(x, [8], weight, 1e-6)
        q = OPS.quantize_per_tensor.default(norm, STEP, 0, quant_min=-128, quant_max=127, dtype=torch.int8)
        return OPS.dequantize_per_tensor.default(q, STEP, 0, -128, 127, torch.int8)


def test_a_quantize_given_its_arguments_by_keyword_rounds_down_alike():
    """:func:`rounding_down` reads each argument by its schema name, positional or keyword."""
    converted = torch.fx.symbolic_trace(NormQuantizedByKeyword())
    x, weight = _inputs()
    norm = rounding_down(converted, rms_norm_roundings(converted))(x, weight)
    exact = torch.ops.aten.rms_norm.default(x, [8], weight, 1e-6)
    assert torch.equal(norm, torch.floor(exact / STEP).clamp(-128, 127) * STEP)
