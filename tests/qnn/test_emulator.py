"""Programs lowered by ExecuTorch's QNN flow, run on QNN's x86 HTP emulator (edgefuse.qnn.emulator)."""

from __future__ import annotations

import pytest
import torch

from edgefuse.qnn.emulator import compare_at_steps, output_steps, run_on_emulator
from edgefuse.core._fx import ops_outside
from edgefuse.core.verify import TOLERANCES, compare

pytestmark = pytest.mark.slow

#: The set-up check's tolerance: one float16 RmsNorm on the HTP against eager.
ULPS = TOLERANCES["qnn set-up"].ulps


def test_qnn_takes_the_whole_norm(lowered_rms_norm):
    program = lowered_rms_norm.edge.exported_program()
    assert ops_outside(lowered_rms_norm.edge) == []
    backends = [m.backend_id for _, m in program.graph_module.named_children() if hasattr(m, "backend_id")]
    assert backends == ["QnnBackend"]


def test_an_rms_norm_on_the_emulator_matches_eager(lowered_rms_norm):
    """fp16 on the HTP against float32 eager, at the "qnn set-up" tolerance's units of float16 at the output's largest value
    (the input and weight rounded to float16, the mean of squares and its root computed in it, the
    output rounded); the output tensor is the norm's."""
    (out,) = run_on_emulator(lowered_rms_norm.pte, lowered_rms_norm.inputs)
    with torch.no_grad():
        expected = lowered_rms_norm.module(*lowered_rms_norm.inputs)
    got = compare(expected, out.to(expected.dtype), ulps=TOLERANCES["qnn set-up"].ulps, dtype=torch.float16)
    assert got.shape_ok and got.max_error <= got.allowed, got
    assert got.max_error > 0  # it ran in float16, not in float32 on the CPU


def test_a_16a8w_rms_norm_on_the_emulator_matches_the_fake_quantized_module(lowered_rms_norm_16a8w):
    """One quantized op: the HTP rounds the norm's output to its 16-bit grid where the fake-quantized
    module rounds the same float result, so they may differ by one step (the neighbouring level)."""
    lowered = lowered_rms_norm_16a8w
    (out,) = run_on_emulator(lowered.pte, lowered.inputs)
    (step,) = output_steps(lowered.module)
    with torch.no_grad():
        expected = lowered.module(*lowered.inputs)
    got = compare_at_steps(expected, out, step, steps=1)
    assert got.shape_ok and got.max_error <= got.allowed, got
    assert got.max_error > 0  # it ran on the HTP's integer kernels, not the fake-quantized float ops


def test_a_permuted_input_is_read_in_its_logical_order(qnn_sdk):
    """An input laid out in another dim order (T5's position bias is a permuted view) reaches QNN's
    delegate as the values eager sees: the runtime copies an input's bytes as they lie and QNN reads
    them contiguous, so the emulator's helper hands it contiguous. fp16 against eager at the "qnn set-up" tolerance's units."""
    import edgefuse.qnn as qnn

    class AddBias(torch.nn.Module):
        def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            return x + bias

    gen = torch.Generator().manual_seed(0)
    x = torch.randn((1, 4, 8, 8), generator=gen)
    bias = torch.randn((1, 8, 8, 4), generator=gen).permute(0, 3, 1, 2)  # dim order (0, 2, 3, 1)
    assert not bias.is_contiguous()
    lowered = qnn.lower(AddBias(), (x, bias), precision="fp16", recompose="stock")
    (out,) = run_on_emulator(lowered.to_pte(), (x, bias))
    got = compare(x + bias, out.to(torch.float32), ulps=TOLERANCES["qnn set-up"].ulps, dtype=torch.float16)
    assert got.shape_ok and got.max_error <= got.allowed, got


def test_roundings_count_the_quantize_ops_that_round_on_the_longest_path(qnn_sdk):
    """A quantize after a reshape or a transpose of values quantized alike gets values on its grid and
    rounds nothing; the input's quantize and each Linear's round. Two branches meet at the add: the
    longer one (two Linears) counts. Read from the converted graph alone; the quantizer needs the QNN
    libraries loaded (without them it tries to download QNN's SDK)."""
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset, QnnExecuTorchBackendType
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgefuse.qnn.emulator import roundings

    class Branches(torch.nn.Module):
        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(0)
            self.a, self.b, self.c = (torch.nn.Linear(16, 16) for _ in range(3))
            for linear in (self.a, self.b, self.c):
                linear.weight.data = torch.randn(16, 16, generator=gen) / 4
                linear.bias.data = torch.randn(16, generator=gen) / 4

        def forward(self, x):
            long = self.b(self.a(x).view(1, 4, 2, 16).transpose(1, 2).reshape(1, 8, 16))
            return long + self.c(x)

    inputs = (torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(1)),)
    quantizer = QnnQuantizer(backend=QnnExecuTorchBackendType.kHtpBackend, soc_model=QcomChipset.SM8650)
    quantizer.set_default_quant_config(QuantDtype.use_16a8w)
    prepared = prepare_pt2e(torch.export.export(Branches(), inputs).module(), quantizer)
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    (counted,) = roundings(converted, inputs)
    assert counted.count == 4, counted  # the input, a, b, the add: not the view, transpose or reshape
    (step,) = output_steps(converted)
    assert counted.coarsest >= step and counted.coarsest_op.startswith("aten.")


def test_a_norm_carries_a_level_of_its_input_at_more_than_one_output_step(qnn_sdk):
    """Linear -> ``GemmaRMSNorm`` at 16a8w: the norm divides by its row's rms, so one level of the Linear's
    output reaches the norm's output at 1.1 to 1.7 of its steps on these rows, and the program lands 3 to
    4 steps off the fake-quantized module (measured on QNN 2.51's emulator) where its 3 roundings allow 3.
    The QNN ``RmsNorm`` alone is within one step (the test above). The derivation carries each rounding's
    level through the module itself, so it allows more than the count here, and the program is within it."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    import edgefuse.qnn as qnn
    from edgefuse.qnn.emulator import output_tolerances

    class LinearNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(0)
            self.linear = torch.nn.Linear(64, 64)
            self.linear.weight.data = torch.randn(64, 64, generator=gen) / 8
            self.norm = GemmaRMSNorm(64, eps=1e-6)
            self.norm.weight.data = torch.randn(64, generator=gen) * 0.1

        def forward(self, x):
            return self.norm(self.linear(x))

    inputs = (torch.randn(1, 16, 64, generator=torch.Generator().manual_seed(1)),)
    lowered = qnn.lower(LinearNorm().eval(), inputs, precision="16a8w", recompose="edgefuse", calibration=[inputs])
    assert lowered.graphs.rms_norms == 1
    ((step, counted),) = output_tolerances(lowered.reference, inputs)
    assert counted.count == 3 and counted.carried > counted.count, counted  # the input, the Linear, the norm
    (out,) = run_on_emulator(lowered.to_pte(), inputs)
    with torch.no_grad():
        expected = lowered.reference(*inputs)
    got = compare_at_steps(expected, out, step, counted.steps)
    assert got.shape_ok and got.max_error <= got.allowed, (got, got.max_error / step, counted)


def test_a_quantize_of_an_empty_tensor_rounds_nothing():
    """A converted graph may quantize an empty tensor (a slice of nothing: found in ExecuTorch's Llama at
    16a8w): it has no value off the grid, so it rounds nothing and the count is the other quantizes'."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    from edgefuse.qnn.emulator import roundings

    ops = torch.ops.quantized_decomposed

    class EmptySlice(torch.nn.Module):
        def forward(self, x):
            q = ops.dequantize_per_tensor.default(ops.quantize_per_tensor.default(x * 3, 0.01, 0, -128, 127, torch.int8),
                                                  0.01, 0, -128, 127, torch.int8)
            empty = q[:, :0] * 2
            e = ops.dequantize_per_tensor.default(ops.quantize_per_tensor.default(empty, 0.01, 0, -128, 127, torch.int8),
                                                  0.01, 0, -128, 127, torch.int8)
            return torch.cat([q, e], dim=1)

    converted = torch.fx.symbolic_trace(EmptySlice())
    (counted,) = roundings(converted, (torch.randn(2, 8, generator=torch.Generator().manual_seed(0)),))
    assert counted.count == 1, counted
