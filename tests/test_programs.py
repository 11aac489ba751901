"""edgefuse's flows leave the caller's exported program as it was (:mod:`edgefuse.programs`).

``to_edge`` shares a non-empty constants dict with the program it was made from, and ExecuTorch's
lowering deletes the constants a delegate takes in from it: lowering the same program twice (stock,
then edgefuse, as ``edgefuse lower`` and ``report --map`` do) failed on the second.
"""

from __future__ import annotations

import torch
from torch.export import export

from edgefuse.flows import lower_to_pte
from edgefuse.modelspec import ModelSpec
from edgefuse.report import build_report
from edgefuse.runtime import LoadedProgram
from edgefuse.verify import compare
from forms import GemmaNorm


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


def _snapshot(program):
    return dict(program.constants), dict(program.state_dict), str(program.graph_signature)


def _same(program, snapshot) -> bool:
    constants, state, signature = snapshot
    return (program.constants.keys() == constants.keys() and all(program.constants[k] is v for k, v in constants.items())
            and program.state_dict.keys() == state.keys() and str(program.graph_signature) == signature)


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
    # no norm or mean: both flows make the same delegate; it reads the constant `c` at float32 precision
    assert torch.equal(got["stock"], got["edgefuse"])
    assert compare(expected, got["edgefuse"]).ok  # two units of float32 at the largest output
    assert torch.equal(program.module()(x), module(x))  # the caller's program still runs, on its own constant


def test_the_edge_report_does_not_add_its_folded_weight_to_the_callers_program():
    module, x = NormBesideAConstant(), _x()
    program = export(module, (x,))
    before = _snapshot(program)
    report = build_report(ModelSpec("norm-beside-a-constant", "file", (x,), module=module), stage="edge",
                          program=program)
    assert [r.decision.rebuilt for r in report.rows] == [True] and report.ok
    assert _same(program, before)
