"""Own errors of two flows: compared within the range both can represent, NaN as the worst error."""

from __future__ import annotations

import math

import torch

from edgefuse.quant.diagnose import NormRun, own_errors


def run(got, exact, low=-math.inf, high=math.inf) -> NormRun:
    got, exact = torch.tensor(got, dtype=torch.float64), torch.tensor(exact, dtype=torch.float64)
    return NormRun(read=exact, got=got, exact=exact, low=low, high=high)


def test_neither_flow_gains_from_clipping_the_other_does_not_do():
    """The exact value 4 lies beyond flow a's range (it hands on 3, clipped) but within flow b's (float
    output, 4.5): both are judged within [-3, 3], where neither is wrong; the 0.1 on the other element
    counts in full."""
    ours = {"n": [run([3.0, 1.1], [4.0, 1.0], -3.0, 3.0)]}
    theirs = {"n": [run([4.5, 1.0], [4.0, 1.0])]}
    (error,) = own_errors(ours, theirs).values()
    assert math.isclose(error.ours, 0.1) and error.theirs == 0.0


def test_an_overshoot_inside_the_shared_range_counts():
    ours = {"n": [run([2.5], [2.0], -3.0, 3.0)]}
    theirs = {"n": [run([2.0], [2.0], -4.0, 4.0)]}
    (error,) = own_errors(ours, theirs).values()
    assert math.isclose(error.ours, 0.5) and error.theirs == 0.0


def test_a_nan_is_the_worst_error_and_norms_of_one_flow_only_are_not_compared():
    ours = {"n": [run([math.nan], [1.0])], "only": [run([1.0], [1.0])]}
    theirs = {"n": [run([1.0], [1.0])]}
    errors = own_errors(ours, theirs)
    assert set(errors) == {"n"} and errors["n"].ours == math.inf and errors["n"].theirs == 0.0


class _Quantized(torch.nn.Module):
    """``2 x`` quantized to 8 bits over [-1, 1] (scale 1/127, zero point 0) and read back."""

    def forward(self, x):
        q = torch.ops.quantized_decomposed.quantize_per_tensor.default(torch.mul(x, 2), 1 / 127, 0, -127, 127, torch.int8)
        return torch.ops.quantized_decomposed.dequantize_per_tensor.default(q, 1 / 127, 0, -127, 127, torch.int8)


def test_beyond_range_gives_the_levels_a_computed_value_lies_outside_its_quantization():
    from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401  (the ops)

    from edgefuse.quant.diagnose import beyond_range

    graph = torch.fx.symbolic_trace(_Quantized())
    ((op, inside),) = beyond_range(graph, (torch.tensor([0.25, -0.5]),)).values()
    ((_, outside),) = beyond_range(graph, (torch.tensor([0.25, -0.75]),)).values()
    assert "mul" in op
    assert inside == 0.0 and math.isclose(outside, 0.5 * 127, rel_tol=1e-6)  # -1.5 is 0.5 beyond -1
