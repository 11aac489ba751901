"""edgefuse's lowering frees the constants of the programs partitioning replaced before it returns, once
the delegates hold enough of them to be worth a collection.

Those programs are reference cycles holding copies of the constants the delegates took in; left to
Python's cycle collector, they stayed in memory through ``to_executorch`` in one export and not in
another: at Qwen3-0.6B's width, the int8 output weight's copy raised edgefuse's ``to_executorch``.
"""

from __future__ import annotations

import pytest

from edgefuse.xnnpack import lowering
from edgefuse.xnnpack.lowering import lower, lower_stock
from tests.harness import tensors_left_to_the_collector

pytestmark = pytest.mark.slow


def test_lower_leaves_no_constant_to_the_cycle_collector(monkeypatch):
    monkeypatch.setattr(lowering, "COLLECT_FROM_BYTES", 0)  # NormAndLinear's delegates hold 130 kB
    assert tensors_left_to_the_collector(lower) == []


def test_a_small_programs_lowering_does_not_pay_for_a_collection():
    shapes = sorted(tuple(t.shape) for t in tensors_left_to_the_collector(lower))
    assert (512, 64) in shapes, shapes


def test_stock_lowering_leaves_the_delegated_constants_to_it():
    shapes = sorted(tuple(t.shape) for t in tensors_left_to_the_collector(lower_stock))
    assert (512, 64) in shapes, shapes
