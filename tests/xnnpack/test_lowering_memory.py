"""edgefuse's lowering frees the constants of the programs partitioning replaced before it returns, once
the delegates hold enough of them to be worth a collection.

Those programs are reference cycles holding copies of the constants the delegates took in; left to
Python's cycle collector, they stayed in memory through ``to_executorch`` in one export and not in
another: at Qwen3-0.6B's width, the int8 output weight's copy raised edgefuse's ``to_executorch``.
"""

from __future__ import annotations

import pytest
import torch

from edgefuse.xnnpack import lowering
from edgefuse.xnnpack.lowering import lower, lower_stock
from tests.harness import tensors_left_to_the_collector

pytestmark = pytest.mark.slow


#: NormAndLinear's 512 x 64 float32 weight: the delegates hold at least these bytes, in their named data.
WEIGHT_BYTES = 512 * 64 * 4


def test_lower_leaves_no_constant_to_the_cycle_collector_once_its_delegates_hold_the_threshold(monkeypatch):
    """The threshold is read from what the delegates hold, the weights in their named data with the blobs:
    the blobs alone (under 2 kB here) never reach it, and no real model's lowering was collected."""
    monkeypatch.setattr(lowering, "COLLECT_FROM_BYTES", WEIGHT_BYTES)
    assert tensors_left_to_the_collector(lower) == []


def test_the_delegates_bytes_count_the_weights_they_keep_outside_their_blobs():
    from tests.harness import NormAndLinear

    program = torch.export.export(NormAndLinear().eval(), (torch.randn(2, 64),))
    held = lowering.delegated_bytes(lower(program))
    assert WEIGHT_BYTES <= held < 2 * WEIGHT_BYTES, held


def test_a_small_programs_lowering_does_not_pay_for_a_collection():
    shapes = sorted(tuple(t.shape) for t in tensors_left_to_the_collector(lower))
    assert (512, 64) in shapes, shapes


def test_stock_lowering_leaves_the_delegated_constants_to_it():
    shapes = sorted(tuple(t.shape) for t in tensors_left_to_the_collector(lower_stock))
    assert (512, 64) in shapes, shapes
