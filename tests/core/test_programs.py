"""edgefuse's flows leave the caller's exported program as it was (:mod:`edgefuse.core.programs`).

``to_edge`` shares a non-empty constants dict with the program it was made from, and ExecuTorch's
lowering deletes the constants a delegate takes in from it: lowering the same program twice (stock,
then edgefuse, as ``edgefuse lower`` and ``report --map`` do) failed on the second.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import export

from edgefuse.compare.pte_checks import lower_to_pte
from edgefuse.inputs.modelspec import ModelSpec
from edgefuse.compare.report import build_report
from edgefuse.runtime import LoadedProgram
from tests.forms import GemmaNorm


class ConstantMatmul(torch.nn.Module):
    """A plain tensor attribute, which export lifts as a constant that the XNNPACK delegate takes in."""

    def __init__(self):
        super().__init__()
        self.c = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.linear(x) @ self.c


class NormBesideAConstant(torch.nn.Module):
    """A Gemma norm, whose ``1 + w`` edgefuse folds into a new constant, beside a lifted constant."""

    def __init__(self):
        super().__init__()
        self.norm = GemmaNorm()
        self.register_buffer("offset", torch.linspace(-1, 1, 16), persistent=False)

    def forward(self, x):
        return self.norm(x), x + self.offset


def _x():
    return torch.randn(2, 16, generator=torch.Generator().manual_seed(0))


def _matmuls_exact_and_bound(module: ConstantMatmul, x: torch.Tensor):
    """``(x W^T + b) c`` in float64, and the float32 error bound of any summation order of each product.

    Each output sums 17 terms (16 products and the bias), then 16: the computed value is within
    ``(g17 + g16 + g17 g16) (|x| |W|^T + |b|) |c|`` of exact, ``gn = n u / (1 - n u)`` (Higham, 3.5).
    """
    w, b, c = (t.detach().double() for t in (module.linear.weight, module.linear.bias, module.c))
    x = x.double()
    u = torch.finfo(torch.float32).eps / 2
    g17, g16 = (n * u / (1 - n * u) for n in (17, 16))
    magnitude = (x.abs() @ w.abs().T + b.abs()) @ c.abs()
    return (x @ w.T + b) @ c, (g17 + g16 + g17 * g16) * magnitude


def _snapshot(program):
    return (dict(program.constants), dict(program.state_dict), str(program.graph_signature),
            program.graph_module.code)


def _same(program, snapshot) -> bool:
    """The program has the same constants (the very tensors), state, signature and graph as before."""
    constants, state, signature, code = snapshot
    return (program.constants.keys() == constants.keys()
            and all(program.constants[k] is v for k, v in constants.items())
            and program.state_dict.keys() == state.keys() and str(program.graph_signature) == signature
            and program.graph_module.code == code)


@pytest.mark.slow
def test_one_program_lowers_stock_then_edgefuse_and_still_runs():
    module, x = ConstantMatmul().eval(), _x()
    program = export(module, (x,))
    before = _snapshot(program)
    assert list(before[0]) == ["c"]
    with torch.no_grad():
        expected = module(x)
    got = {}
    for how in ("stock", "edgefuse"):  # the second lowering failed with KeyError 'c'
        lowered = lower_to_pte(program, how)
        assert lowered.summary.delegates == 1 and not lowered.summary.outside, lowered.summary
        got[how] = LoadedProgram(lowered.pte).run((x,))[0]
        assert _same(program, before), how
    # the second lowering of the one program writes what a lowering of a fresh export writes
    assert lowered.pte == lower_to_pte(export(module, (x,)), "edgefuse").pte
    # no norm or mean: both flows make the same delegate, which reads the constant `c` (float32)
    assert torch.equal(got["stock"], got["edgefuse"])
    exact, bound = _matmuls_exact_and_bound(module, x)
    assert ((got["edgefuse"].double() - exact).abs() <= bound).all()
    assert ((expected.double() - exact).abs() <= bound).all()
    assert torch.equal(program.module()(x), module(x))  # the caller's program still runs, on its own constant


def test_the_edge_report_does_not_add_its_folded_weight_to_the_callers_program():
    module, x = NormBesideAConstant(), _x()
    program = export(module, (x,))
    before = _snapshot(program)
    report = build_report(ModelSpec("norm-beside-a-constant", "file", (x,), module=module), stage="edge",
                          program=program)
    assert [r.decision.rebuilt for r in report.rows] == [True] and report.ok
    assert _same(program, before)
    for got, expected in zip(program.module()(x), module(x)):  # and it still runs, on its own constants
        assert torch.equal(got, expected)
