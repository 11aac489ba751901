"""The comparison the tests rely on: tolerances from the dtype, and infinities and NaNs handled."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import edgefuse

from edgefuse.core.verify import compare, compare_elementwise, finite_tolerance, max_error, mean_error, tolerance, ulp


def test_tolerance_is_units_in_the_last_place_at_the_largest_magnitude():
    reference = torch.tensor([0.5, -8.0], dtype=torch.float16)
    assert tolerance(torch.float16, reference, ulps=2) == 2 * ulp(torch.float16) * 8.0


def test_small_outputs_get_a_small_tolerance():
    """A norm scaled by a weight of 1e-3 is judged at its own magnitude, not at 1."""
    reference = torch.tensor([1e-3, -2e-3], dtype=torch.float16)
    assert tolerance(torch.float16, reference, ulps=2) == 2 * ulp(torch.float16) * float(reference.abs().max())
    assert not compare(reference, reference + 1e-4).ok  # about 50 units in the last place at 2e-3


def test_an_all_zero_output_is_compared_at_the_smallest_normal_value():
    reference = torch.zeros(3)
    assert compare(reference, reference.clone()).ok
    assert not compare(reference, reference + 1e-30).ok


def test_one_unit_in_the_last_place_passes_and_three_fail():
    reference = torch.tensor([1.0, 2.0], dtype=torch.float16)
    step = torch.tensor([0.0, 2 * ulp(torch.float16)], dtype=torch.float16)  # one unit at 2.0
    assert compare(reference, reference + step).ok
    assert not compare(reference, reference + 3 * step).ok


def test_equal_infinities_and_nans_agree_and_a_finite_value_against_infinity_fails():
    reference = torch.tensor([float("inf"), float("nan"), 1.0])
    assert compare(reference, reference.clone()).ok
    assert not compare(torch.tensor([float("inf"), 1.0]), torch.tensor([60000.0, 1.0])).ok
    assert not compare(torch.tensor([1.0, 1.0]), torch.tensor([float("nan"), 1.0])).ok


def test_a_different_dtype_or_shape_fails():
    reference = torch.ones(3)
    assert not compare(reference, reference.half()).ok
    assert not compare(reference, torch.ones(4)).ok


def test_integer_outputs_must_match_exactly_whatever_dtype_is_asked():
    reference = torch.tensor([1, 2, 3])
    assert compare(reference, reference.clone()).ok
    off_by_one = compare(reference, torch.tensor([1, 2, 4]), ulps=4, dtype=torch.float16)
    assert not off_by_one.ok and off_by_one.allowed == 0.0 and off_by_one.max_error == 1.0


def test_integers_beyond_float64s_precision_are_compared_exactly():
    reference = torch.tensor([2**53], dtype=torch.int64)  # 2**53 + 1 rounds to 2**53 in float64
    assert max_error(reference, reference + 1) == 1.0 and not compare(reference, reference + 1).ok
    assert max_error(reference, reference.clone()) == 0.0


def test_integers_of_two_dtypes_differ_in_dtype_without_an_error():
    # torch.equal refuses to promote uint32: the comparison reports the dtype instead of raising
    comparison = compare(torch.tensor([1]), torch.tensor([2], dtype=torch.uint32))
    assert not comparison.dtype_ok and not comparison.ok


def test_complex_outputs_are_compared_on_both_parts_at_the_magnitude():
    reference = torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex64)
    assert max_error(reference, reference + 1j) == 1.0  # the real parts agree; the imaginary ones do not
    assert not compare(reference, reference.conj()).ok
    # two units of float32 at the largest magnitude, |-3 + 0.5j|
    assert finite_tolerance(reference.dtype, reference) == 2 * ulp(torch.float32) * float(reference.abs().max())
    assert compare(reference, reference * (1 + ulp(torch.float32))).ok
    assert max_error(reference, reference.real) == float("inf")  # a real result for a complex one
    assert not compare_elementwise(reference, reference + 1j).ok
    # elementwise, each part is in units of the complex value's magnitude, not of the part's own
    small_part = torch.tensor([1000 + 0.001j], dtype=torch.complex64)
    assert compare_elementwise(small_part, small_part + 1j * 1000 * ulp(torch.float32)).ok
    # part by part: a NaN in one part hides no difference in the other
    nan = float("nan")
    assert max_error(torch.tensor([complex(nan, 1)]), torch.tensor([complex(nan, 5)])) == 4.0
    assert max_error(torch.tensor([complex(nan, 1)]), torch.tensor([complex(1, nan)])) == float("inf")
    # the infinities of a reference give no scale to its tolerance
    assert finite_tolerance(reference.dtype, torch.cat([reference, torch.tensor([complex(float("inf"), 0)])])) == (
        finite_tolerance(reference.dtype, reference))


def test_every_check_reads_its_slack_from_the_table():
    # a comparison given its units in the last place as a number, not an entry of TOLERANCES with its reason
    call = re.compile(r"\b(compare_at|finite_tolerance)\((?:[^()]|\([^()]*\))*,\s*(?:ulps=)?[0-9][0-9.]*\)")
    written = [f"{path.name}: {match.group(0)}" for path in sorted(Path(edgefuse.__file__).parent.rglob("*.py"))
               for match in call.finditer(path.read_text())]
    assert written == []


def test_mean_error_is_the_mean_absolute_difference():
    assert mean_error(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 1.0])) == 0.75


def test_mean_error_refuses_tensors_of_different_shapes():
    # broadcast, a (2,) tensor against a (2, 1) one would give a mean over four differences
    with pytest.raises(ValueError, match=r"\(2,\) and \(2, 1\)"):
        mean_error(torch.zeros(2), torch.ones(2, 1))


def test_mean_error_of_empty_tensors_is_zero():
    assert mean_error(torch.zeros(0), torch.zeros(0)) == 0.0 == max_error(torch.zeros(0), torch.zeros(0))
