"""edgefuse's lowering frees the constants of the programs partitioning replaced before it returns.

Those programs are reference cycles holding copies of the constants the delegates took in; left to
Python's cycle collector, they stayed in memory through ``to_executorch`` in one export and not in
another, and raised the peak of a real-size export by the size of its quantized weights.
"""

from __future__ import annotations

import pytest

from edgefuse.xnnpack.lowering import lower, lower_stock
from tests.xnnpack.xnn_helpers import tensors_left_to_the_collector

pytestmark = pytest.mark.slow


def test_lower_leaves_no_constant_to_the_cycle_collector():
    assert tensors_left_to_the_collector(lower) == []


def test_stock_lowering_leaves_the_delegated_constants_to_it():
    shapes = sorted(tuple(t.shape) for t in tensors_left_to_the_collector(lower_stock))
    assert (512, 64) in shapes, shapes
