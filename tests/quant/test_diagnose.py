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
