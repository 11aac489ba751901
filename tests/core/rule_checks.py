"""What the rule tests check: a rebuilt norm matches eager, a norm left says why and changes nothing."""

from __future__ import annotations

import torch

from edgefuse.core.verify import compare, compare_elementwise
from tests.harness import rms_norm_nodes


def sample(dtype=torch.float32, shape=(2, 5, 16), seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).mul(3).to(dtype)


def assert_matches_eager(module, inputs, rewritten, ulps=2.0, dtype=None):
    """Each element within ``ulps`` units in its last place in ``dtype`` (the norm's, when wider ops follow it)."""
    expected, actual = module(*inputs), rewritten.run(*inputs)
    comparison = compare_elementwise(expected, actual, ulps, dtype)
    assert comparison.dtype_ok and comparison.ok, (comparison, expected.dtype)


def assert_left(rewritten, *phrases):
    """No rms_norm was built, every candidate says why, the reason names the rule, and the program still
    computes exactly what eager does (left decomposed, nothing may change)."""
    assert phrases, "name the rule's reason"
    assert rms_norm_nodes(rewritten.graph_module) == []
    decisions = rewritten.result.decisions
    assert decisions and not any(d.rebuilt for d in decisions)
    reasons = " | ".join(d.reason for d in decisions)
    for phrase in phrases:
        assert phrase in reasons, reasons
    with torch.no_grad():
        expected, actual = rewritten.module(*rewritten.inputs), rewritten.run(*rewritten.inputs)
    for e, a in zip(*(x if isinstance(x, tuple) else (x,) for x in (expected, actual))):
        assert compare(e, a, ulps=0).ok, compare(e, a, ulps=0)
