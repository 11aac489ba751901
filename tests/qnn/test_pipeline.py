"""edgefuse.qnn.lower on Linear -> norm -> Linear blocks, compiled by QNN and run on the x86 HTP emulator.

The norms are the real classes: transformers' ``LlamaRMSNorm`` and ``GemmaRMSNorm`` (``1 + w``) and
ExecuTorch's own Llama ``RMSNorm``. Each lowering is shared by the tests that read it (module fixtures),
so the tier lowers seven programs in all.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgefuse.compare.qnn_flows import FP16_ULPS
from edgefuse.qnn import QnnLoweringFailed, lower
from edgefuse.qnn.emulator import compare_at_steps, output_tolerances
from edgefuse.runtime import LoadedProgram
from edgefuse.core.verify import compare

pytestmark = [pytest.mark.usefixtures("qnn_sdk"), pytest.mark.slow]

D = 64  # a last dim no QNN limit covers: the blocks' norms are rebuilt as they are written
TOKENS = 8


def _norms():
    from executorch.examples.models.llama.norm import RMSNorm as ExecuTorchRMSNorm
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return {"llama": LlamaRMSNorm(D, eps=1e-6), "executorch": ExecuTorchRMSNorm(D, eps=1e-6), "gemma": GemmaRMSNorm(D, eps=1e-6)}


class Blocks(nn.Module):
    """Linear -> norm -> Linear for each norm named, chained, then ``* 0.5``."""

    def __init__(self, names):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        norms = _norms()
        self.norms = nn.ModuleDict({n: norms[n] for n in names})
        for norm in self.norms.values():
            norm.weight.data = torch.rand(D, generator=generator) + 0.5
        self.linears = nn.ModuleList(nn.Linear(D, D) for _ in range(len(names) + 1))
        for linear in self.linears:
            linear.weight.data = torch.randn(D, D, generator=generator) / D**0.5
            linear.bias.data = torch.randn(D, generator=generator) * 0.1

    def forward(self, x):
        x = self.linears[0](x)
        for norm, linear in zip(self.norms.values(), self.linears[1:]):
            x = linear(norm(x))
        return x * 0.5


ALL = ("llama", "executorch", "gemma")


def _inputs(seed=0):
    return (torch.randn(1, TOKENS, D, generator=torch.Generator().manual_seed(seed)),)


CALIBRATION = [_inputs(seed) for seed in range(4)]


def _lower(names, precision, recompose):
    model = Blocks(names).eval()
    calibration = CALIBRATION if precision != "fp16" else None
    return model, lower(model, _inputs(), precision=precision, recompose=recompose, calibration=calibration)


@pytest.fixture(scope="module")
def edgefuse_fp16():
    return _lower(ALL, "fp16", "edgefuse")


@pytest.fixture(scope="module")
def edgefuse_16a8w():
    return _lower(ALL, "16a8w", "edgefuse")


@pytest.fixture(scope="module")
def stock_16a8w():
    return _lower(ALL, "16a8w", "stock")


def _run(lowered, inputs):
    return LoadedProgram(lowered.to_pte()).run(inputs)[0]


def _within_float16(expected: torch.Tensor, actual: torch.Tensor) -> None:
    """fp16 on the HTP against float32 eager at the application's derived bound (:data:`FP16_ULPS` units of
    float16 at the output's largest magnitude); the output tensor is the last Linear's, times 0.5."""
    got = compare(expected, actual.to(expected.dtype), ulps=FP16_ULPS, dtype=torch.float16)
    assert got.shape_ok and got.max_error <= got.allowed, (got.max_error, got.allowed)


def _within_steps(lowered, inputs) -> float:
    """A quantized program on the emulator against its fake-quantized module at the derived tolerance
    (:func:`edgefuse.qnn.emulator.output_tolerances`); returns the error in output steps."""
    ((step, counted),) = output_tolerances(lowered.reference, inputs)
    with torch.no_grad():
        expected = lowered.reference(*inputs)
    got = compare_at_steps(expected, _run(lowered, inputs), step, counted.steps)
    assert got.shape_ok and got.max_error <= got.allowed, (got.max_error / step, counted)
    return got.max_error / step


@pytest.mark.parametrize("fixture", ["edgefuse_fp16", "edgefuse_16a8w"])
def test_each_rebuilt_norm_is_one_qnn_rms_norm(fixture, request):
    _, lowered = request.getfixturevalue(fixture)
    rebuilt = [d for d in lowered.decisions if d.rebuilt]
    assert len(rebuilt) == 3 and not [d for d in lowered.decisions if not d.rebuilt], lowered.decisions
    assert [p.qnn_op for p in lowered.graphs.norms if p.rebuilt] == ["RmsNorm"] * 3
    assert lowered.graphs.rms_norms == 3 and len(lowered.graphs.delegates) == 1
    assert lowered.graphs.outside == []  # nothing of any norm, nor anything else, left outside the delegate
    types = lowered.graphs.delegates[0].op_types()
    for decomposed in ("ReduceMean", "ElementWiseRsqrt", "ElementWisePower"):
        assert decomposed not in types, types


def test_fp16_program_matches_eager(edgefuse_fp16):
    model, lowered = edgefuse_fp16
    inputs = _inputs(7)
    with torch.no_grad():
        _within_float16(model(*inputs), _run(lowered, inputs))


def test_16a8w_program_matches_the_fake_quantized_module(edgefuse_16a8w):
    model, lowered = edgefuse_16a8w
    inputs = CALIBRATION[0]  # calibrated inputs: every value in range, so the error is rounding alone
    steps = _within_steps(lowered, inputs)
    with torch.no_grad():
        float_error = float((_run(lowered, inputs) - model(*inputs)).abs().max())  # information: quantization's
    print(f"16a8w: {steps:.1f} steps from the fake-quantized module, {float_error:.3g} from float eager")


def test_stock_leaves_gemma_decomposed_at_16a8w(stock_16a8w, edgefuse_16a8w):
    _, stock = stock_16a8w
    _, ours = edgefuse_16a8w
    assert stock.decisions == [] and stock.runs == []  # the released flow ran untouched
    # the released pass rebuilds fewer (Gemma's 1 + w never): the rest are quantized op by op
    assert stock.graphs.rms_norms < ours.graphs.rms_norms == 3
    assert stock.graphs.delegates[0].op_types()["ReduceMean"] == 3 - stock.graphs.rms_norms
    _within_steps(stock, CALIBRATION[0])  # stock's program is right too, only larger


def test_stock_cannot_lower_gemma_at_fp16():
    model = Blocks(("gemma",)).eval()
    with pytest.raises(QnnLoweringFailed, match="LayoutTransform"):
        lower(model, _inputs(), precision="fp16", recompose="stock")


def test_norms_the_16a8w_pipeline_rebuilds_are_rebuilt_at_fp16(edgefuse_fp16, edgefuse_16a8w):
    fp16, quantized = edgefuse_fp16[1], edgefuse_16a8w[1]
    assert len([d for d in fp16.decisions if d.rebuilt]) == len([d for d in quantized.decisions if d.rebuilt])
    for decision in fp16.decisions:
        assert decision.rebuilt or "qnn computes rms_norm wrong" in decision.reason, decision
    # at fp16 the norms are rebuilt in the edge graph, whose weights are lifted; at 16a8w in the captured one
    assert {run.pipeline for run in fp16.runs if any(d.rebuilt for d in run.decisions)} == {"to_edge"}
    assert {run.pipeline for run in quantized.runs if any(d.rebuilt for d in run.decisions)} == {"annotation"}


def test_stock_fp16_beside_edgefuse(edgefuse_fp16):
    # The released flow at fp16 on the forms it lowers: the same single RmsNorm each, the same error bound.
    model = Blocks(("llama", "executorch")).eval()
    stock = lower(model, _inputs(), precision="fp16", recompose="stock")
    assert stock.graphs.rms_norms == 2 and stock.graphs.outside == []
    inputs = _inputs(7)
    with torch.no_grad():
        _within_float16(model(*inputs), _run(stock, inputs))
