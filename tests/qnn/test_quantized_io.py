"""A quantized program's inputs and outputs held against its fake-quantized module's: the integer type of
each one's levels is the type the program must declare, since QNN reads and writes the levels it was
compiled with into buffers the runtime sizes by the declaration."""

from __future__ import annotations

import torch

from edgefuse.qnn.emulator import quantized_io
from edgefuse.runtime import TensorMeta


class SixteenBitThrough(torch.nn.Module):
    """Reads its input as 16-bit levels and gives its output as 16-bit levels, as the static-Llama script's
    logits and attention mask are."""

    def forward(self, x):
        ops = torch.ops.quantized_decomposed
        levels = ops.quantize_per_tensor.default(x, 0.001, 32768, 0, 65535, torch.int32)
        y = ops.dequantize_per_tensor.default(levels, 0.001, 32768, 0, 65535, torch.int32) * 2
        out = ops.quantize_per_tensor.default(y, 0.002, 32768, 0, 65535, torch.int32)
        return ops.dequantize_per_tensor.default(out, 0.002, 32768, 0, 65535, torch.int32)


def _io():
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    return quantized_io(torch.fx.symbolic_trace(SixteenBitThrough()))


def test_a_program_declaring_the_levels_type_has_no_mismatch():
    uint16 = TensorMeta((1, 16, 48), torch.uint16, 1536)
    assert _io().mismatches([uint16], [uint16]) == []


def test_an_output_declared_narrower_than_its_levels_is_named_with_both_sizes():
    """The static-Llama script's logits at a vocabulary equal to the head dim: declared ``uint8``, written
    by QNN as 16-bit levels, twice the bytes of the buffer the runtime gives it."""
    declared_in = TensorMeta((1, 16, 64), torch.uint16, 2048)
    declared_out = TensorMeta((1, 16, 64), torch.uint8, 1024)
    assert _io().mismatches([declared_in], [declared_out]) == [
        "output 0 is declared uint8 [1, 16, 64] (1024 bytes) where its module's levels are uint16 (2048 bytes)"
    ]


def test_an_input_is_held_to_its_levels_too_and_a_value_no_quantize_reads_is_not():
    declared_in = TensorMeta((2, 3), torch.int16, 12)
    assert _io().mismatches([declared_in], [None]) == [
        "input 0 is declared int16 [2, 3] (12 bytes) where its module's levels are uint16 (12 bytes)"
    ]
    float_out = TensorMeta((2, 3), torch.float32, 24)
    assert quantized_io(torch.fx.symbolic_trace(torch.nn.ReLU())).mismatches([float_out], [float_out]) == []


def test_a_quantized_output_declared_float_is_dequantized_by_qnn_and_no_mismatch():
    """An output the script leaves untagged: QNN dequantizes it inside the delegate and the program
    declares it float32."""
    uint16 = TensorMeta((1, 16, 48), torch.uint16, 1536)
    float32 = TensorMeta((1, 16, 48), torch.float32, 3072)
    assert _io().mismatches([uint16], [float32]) == []


def test_a_quantized_input_declared_float_is_a_mismatch():
    """The program is fed a quantized input's levels, which the runtime refuses for an input declared float:
    the float exemption holds for outputs alone."""
    uint16 = TensorMeta((1, 16, 48), torch.uint16, 1536)
    float32 = TensorMeta((1, 16, 48), torch.float32, 3072)
    assert _io().mismatches([float32], [uint16]) == [
        "input 0 is declared float32 [1, 16, 48] (3072 bytes) where its module's levels are uint16 (1536 bytes), "
        "and is fed those levels, which the runtime refuses for a float input"
    ]


def test_a_count_of_declared_inputs_or_outputs_other_than_the_modules_is_a_mismatch():
    uint16 = TensorMeta((1, 16, 48), torch.uint16, 1536)
    assert _io().mismatches([uint16], [uint16, None]) == ["method declares 2 outputs where its module has 1"]
    assert _io().mismatches([], [uint16]) == ["method declares 0 inputs where its module has 1"]


def test_a_type_torch_lacks_is_named_by_the_runtime():
    bits16 = TensorMeta((2, 3), None, 12, code=22)
    assert _io().mismatches([bits16], [None]) == [
        "input 0 is declared ScalarType BITS16 [2, 3] (12 bytes) where its module's levels are uint16 (12 bytes)"
    ]


def test_only_a_declaration_smaller_than_the_levels_overruns_its_buffer():
    narrower = TensorMeta((1, 16, 64), torch.uint8, 1024)
    wider = TensorMeta((1, 16, 64), torch.int32, 4096)
    assert _io().overruns([None], [narrower]) and not _io().overruns([None], [wider])


class PerChannelThrough(torch.nn.Module):
    """Reads its input as 8-bit levels quantized per channel: the range and dtype sit one argument later
    than a per-tensor quantize's (after the axis)."""

    def forward(self, x):
        ops = torch.ops.quantized_decomposed
        scales, zero_points = torch.full((3,), 0.01), torch.zeros(3, dtype=torch.int64)
        levels = ops.quantize_per_channel.default(x, scales, zero_points, 1, -128, 127, torch.int8)
        return ops.dequantize_per_channel.default(levels, scales, zero_points, 1, -128, 127, torch.int8)


def test_a_per_channel_quantize_is_read_by_its_schema():
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    io = quantized_io(torch.fx.symbolic_trace(PerChannelThrough()))
    int8, uint8 = TensorMeta((2, 3), torch.int8, 6), TensorMeta((2, 3), torch.uint8, 6)
    assert io.mismatches([int8], [int8]) == []
    assert io.mismatches([uint8], [int8]) == [
        "input 0 is declared uint8 [2, 3] (6 bytes) where its module's levels are int8 (6 bytes)"
    ]


class KeywordThrough(torch.nn.Module):
    """Reads its input as 16-bit levels and gives them back, its quantize ops given the range and dtype by
    keyword."""

    def forward(self, x):
        ops = torch.ops.quantized_decomposed
        levels = ops.quantize_per_tensor.default(x, 0.001, 32768, quant_min=0, quant_max=65535, dtype=torch.int32)
        return ops.dequantize_per_tensor.default(levels, 0.001, 32768, quant_min=0, quant_max=65535, dtype=torch.int32)


def test_quantize_ops_given_keyword_arguments_quantize_the_inputs_and_dequantize_the_outputs():
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    io = quantized_io(torch.fx.symbolic_trace(KeywordThrough()))
    x = torch.tensor([[0.0, 0.5, -0.25]])
    (levels,) = io.program_inputs([x])
    assert levels.dtype == torch.uint16 and levels.tolist() == [[32768, 33268, 32518]]
    (back,) = io.module_outputs([levels])
    assert torch.allclose(back, x)
