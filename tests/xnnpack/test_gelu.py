"""GELU: the erf form is stock's ``XNNGelu``; the tanh form is built inside the delegate from float32
multiplies, adds and a tanh, and rounded once to the tensor's dtype, as ATen's kernel computes it.

The released XNNPACK visitor serializes every ``gelu`` as ``XNNGelu`` and drops ``approximate``; a model
using ``gelu_pytorch_tanh`` (Gemma) lowered stock computes a different function. The inputs sit where the
two forms differ most (around ``x = -2.7``, 4.7e-4 apart) and where ``1 + tanh`` cancels (down to
``x = -6``), so a GELU computed in the wrong form, or rounded to a half dtype at each step, misses the
bound of :func:`gelu_tolerance`.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from tests.xnnpack.xnn_helpers import lower_and_run

pytestmark = pytest.mark.slow


class Gelu(torch.nn.Module):
    def __init__(self, approximate: str):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate=self.approximate)


#: The delegate's nodes of one tanh GELU in float32: ATen's steps, in its order.
STEPS = ["XNNMultiply"] * 3 + ["XNNAdd", "XNNMultiply", "XNNTanh", "XNNAdd", "XNNMultiply", "XNNMultiply"]


def negative(dtype: torch.dtype = torch.float32, rows: int = 4) -> tuple[torch.Tensor]:
    """Inputs from -6 to -1: the forms differ most near -2.7, and below -3 ``1 + tanh`` cancels."""
    return (torch.linspace(-6.0, -1.0, rows * 128, dtype=torch.float64).reshape(rows, 128).to(dtype),)


def gelu_tolerance(dtype: torch.dtype, x: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """What each element of a tanh GELU computed in float32 and rounded once to ``dtype`` may differ from
    eager's by, eager computing the same steps in float32 and rounding once too: a unit of ``dtype`` at the
    element's own magnitude (the one rounding may land on the neighbouring value; at least the smallest
    subnormal step), and a few float32 units of float32 tanh near +-1, which the multiply by ``x / 2``
    scales (the delegate's tanh is XNNPACK's, eager's ATen's; nothing else in the chain differs). The factor
    4 is measured, not derived: the delegate stays within 0.67 of this bound over -8..8 in each dtype on
    x86; a float16 chain that rounds each step went past it 1966 times over, a bfloat16 one 1.9 times."""
    eps = torch.finfo(dtype).eps
    return (eps * expected.double().abs() + eps * torch.finfo(dtype).tiny
            + 4 * torch.finfo(torch.float32).eps * 0.5 * x.double().abs())


def assert_gelu_matches(result, inputs) -> None:
    """Each run's output against eager's within :func:`gelu_tolerance` element by element, at eager's dtype
    and shape (the GELU's node reads the model's input ``x``)."""
    for (x,), actual, expected in zip(inputs, result.outputs, result.expected):
        a, e = actual[0], expected[0]
        assert a.dtype == e.dtype and a.shape == e.shape
        worst = float(((a.double() - e.double()).abs() / gelu_tolerance(e.dtype, x, e)).max())
        assert worst <= 1.0, f"{e.dtype}: an element {worst:.3g} times its bound"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_a_tanh_gelu_is_computed_inside_the_delegate_in_float32_and_rounded_once(dtype):
    """The GELU's node reads the model's input ``x``; float32 runs the steps directly, a half dtype between
    two converts. A second run over -8..8 checks the positive side too."""
    options = {"enable_bf16": True} if dtype == torch.bfloat16 else {}
    wide = (torch.linspace(-8.0, 8.0, 512, dtype=torch.float64).reshape(4, 128).to(dtype),)
    ours = lower_and_run(Gelu("tanh"), negative(dtype), run_inputs=[wide], **options)
    assert not ours.outside, ours.outside
    converts = [] if dtype == torch.float32 else ["XNNConvert"]
    assert ours.types == [converts + STEPS + converts], ours.types
    assert_gelu_matches(ours, [negative(dtype), wide])


def test_stock_computes_the_erf_gelu_for_a_tanh_gelu():
    """Why edgefuse takes the tanh GELU itself: stock's program is off by far more than the bound."""
    stock = lower_and_run(Gelu("tanh"), negative(), stock=True)
    assert any("XNNGelu" in types for types in stock.types)
    error = (stock.outputs[0][0].double() - stock.expected[0][0].double()).abs()
    worst = float((error / gelu_tolerance(torch.float32, negative()[0], stock.expected[0][0])).max())
    assert worst > 100, f"stock's erf GELU should differ from the tanh form here, {worst:.3g} times the bound"


def test_a_tanh_gelu_of_a_run_time_length_and_of_a_channels_last_tensor():
    """The steps' intermediate values take the shape and layout the delegate gave the GELU's input: a
    length known at run time (two lengths run), and a convolution's channels-last output."""
    seq = Dim("seq", min=2, max=64)
    runs = [(torch.linspace(-6.0, 2.0, 3 * 40 * 8).reshape(3, 40, 8),)]
    first = (torch.linspace(-6.0, 2.0, 3 * 5 * 8).reshape(3, 5, 8),)
    ours = lower_and_run(Gelu("tanh"), first, run_inputs=runs, dynamic_shapes=({1: seq},))
    assert not ours.outside, ours.outside
    assert_gelu_matches(ours, [first, *runs])

    class ConvGelu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            with torch.no_grad():
                self.conv.bias -= 3.0  # into the range where 1 + tanh cancels

        def forward(self, x):
            return torch.nn.functional.gelu(self.conv(x), approximate="tanh")

    torch.manual_seed(0)
    module, image = ConvGelu(), torch.randn(1, 3, 8, 8)
    conv = lower_and_run(module, (image,))
    assert not conv.outside, conv.outside
    # the GELU runs on the convolution's channels-last output: the one transpose back to NCHW follows it
    assert conv.types == [["XNNStaticTranspose", "XNNConv2d", *STEPS, "XNNStaticTranspose"]], conv.types
    with torch.no_grad():
        gelu_input = module.conv(image)  # what the GELU's node reads
    assert_gelu_matches(conv, [(gelu_input,)])


def test_a_gelu_of_a_0_d_tensor_or_of_a_dequantized_one_is_left_to_stocks_path():
    """A 0-d GELU (the delegate returns no 0-d tensor) and a GELU reading a dequantize (the delegate could
    hand it the quantized value) keep ``aten.gelu`` and the reason."""
    from executorch.exir import to_edge

    from edgefuse.core.ops import EDGE, Role
    from edgefuse.xnnpack.substitute import gelu_reason

    class Dequantized(torch.nn.Module):
        def forward(self, q, s):
            x = torch.ops.quantized_decomposed.dequantize_per_tensor(q, 0.05, 0, -128, 127, torch.int8)
            return torch.nn.functional.gelu(x, approximate="tanh"), torch.nn.functional.gelu(s, approximate="tanh")

    program = to_edge(torch.export.export(Dequantized(), (torch.zeros(4, 8, dtype=torch.int8), torch.tensor(-2.0))))
    gelus = [node for node in program.exported_program().graph.nodes if EDGE.is_a(node, Role.GELU)]
    assert [gelu_reason(node) for node in gelus] == [
        "GELU of a dequantized tensor: the delegate could hand it a quantized value; stock path",
        "GELU of a 0-d tensor: the delegate cannot return a 0-d tensor",
    ]
    ours = lower_and_run(Gelu("tanh"), (torch.tensor(-2.5),))
    assert ours.outside == ["aten.gelu.default"], ours.outside
    assert_gelu_matches(ours, [(torch.tensor(-2.5),)])


def test_without_the_gelu_substitution_a_tanh_gelu_stays_on_the_portable_kernel():
    """``gelus=False``: the tanh GELU reaches ``ExactGeluConfig``, which keeps it from the delegate's erf GELU."""
    ours = lower_and_run(Gelu("tanh"), negative(), gelus=False)
    assert ours.outside == ["aten.gelu.default"], ours.outside
    assert all("XNNGelu" not in types for types in ours.types)
    assert_gelu_matches(ours, [negative()])


def test_a_tanh_gelu_the_partitioner_refuses_is_put_back_as_aten_gelu():
    """A bfloat16 GELU without ``enable_bf16``: substituted, refused by the config, restored with its
    ``approximate``, and computed by the portable kernel."""
    ours = lower_and_run(Gelu("tanh"), negative(torch.bfloat16))
    assert ours.outside == ["aten.gelu.default"], ours.outside
    assert_gelu_matches(ours, [negative(torch.bfloat16)])


def test_an_erf_gelu_is_still_stocks():
    """edgefuse hands the erf GELU to stock's ``XNNGelu``: its program gives stock's outputs bit for bit."""
    ours = lower_and_run(Gelu("none"), negative())
    stock = lower_and_run(Gelu("none"), negative(), stock=True)
    assert not ours.outside, ours.outside
    assert ours.counts["XNNGelu"] == 1 and ours.counts["XNNTanh"] == 0
    assert torch.equal(ours.outputs[0][0], stock.outputs[0][0])


def test_a_config_list_without_gelu_keeps_either_gelu_out_as_stock_does():
    """edgefuse's GELU configs amend the stock one: given configs without it, no GELU is delegated."""
    from executorch.backends.xnnpack.partition.config.generic_node_configs import AddConfig, MulConfig

    for approximate in ("none", "tanh"):
        ours = lower_and_run(Gelu(approximate), negative(), configs=[AddConfig, MulConfig])
        assert ours.outside == ["aten.gelu.default"], (approximate, ours.outside)
        assert_gelu_matches(ours, [negative()])
