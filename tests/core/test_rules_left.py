"""Norms left decomposed for what surrounds them: a scaled eps, a written buffer, a shared root, a transposed output, a subgraph."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgefuse.core.verify import compare
from tests.core.rule_checks import assert_left, assert_matches_eager, sample
from tests.forms import LlamaNorm
from tests.harness import MODES, rewrite, rms_norm_nodes


class ScaledEpsNorm(nn.Module):
    """``mean + alpha * eps`` through ``aten.add.Scalar``, whose alpha is positional."""

    def forward(self, x):
        return x * torch.rsqrt(torch.ops.aten.add.Scalar(x.pow(2).mean(-1, keepdim=True), 0.5, 4))


@pytest.mark.parametrize("mode", MODES)
def test_rule_eps_scaled_by_a_positional_alpha_stays(mode):
    module = ScaledEpsNorm()
    rewritten = rewrite(module, (sample(),), mode)
    assert_left(rewritten, "alpha")
    assert_matches_eager(module, (sample(),), rewritten, ulps=0)


class StatefulEpsNorm(nn.Module):
    """eps is a buffer the model updates on every call: state, not a constant to fold."""

    def __init__(self):
        super().__init__()
        self.register_buffer("eps", torch.tensor(1.0))

    def forward(self, x):
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        self.eps.add_(1.0)
        return out


@pytest.mark.parametrize("mode", ("edge",))
def test_rule_a_buffer_the_model_mutates_is_never_folded_into_eps(mode):
    rewritten = rewrite(StatefulEpsNorm(), (sample(),), mode)
    assert_left(rewritten, "not a constant")
    reference = StatefulEpsNorm()
    reference(sample())  # the program has run once, in assert_left
    for _ in range(3):  # the buffer grows on every call: eps must follow it
        assert compare(reference(sample()), rewritten.run(sample()), ulps=0).ok


class SharedRsqrtNorm(nn.Module):
    """The inverse root is also an output: a rebuilt norm would have to compute it twice."""

    def forward(self, x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * r, r


@pytest.mark.parametrize("mode", MODES)
def test_a_shared_inverse_root_stays_and_says_so(mode):
    module, inputs = SharedRsqrtNorm(), (sample(),)
    rewritten = rewrite(module, inputs, mode)
    assert_left(rewritten, "is used by 2 nodes")
    for expected, actual in zip(module(*inputs), rewritten.run(*inputs)):
        assert compare(expected, actual, ulps=0).ok


class NormInABranch(nn.Module):
    """A Llama norm in one branch of ``torch.cond`` and a top-level norm after it."""

    def __init__(self):
        super().__init__()
        self.inner = LlamaNorm(16)
        self.outer = LlamaNorm(16)

    def forward(self, x):
        y = torch.cond(x.sum() > 0, lambda t: self.inner(t), lambda t: t * 2.0, (x,))
        return self.outer(y)


class NormInAMap(nn.Module):
    """A Llama norm in the body of ``map``: the top level of its edge graph calls no edge op."""

    def __init__(self):
        super().__init__()
        self.inner = LlamaNorm(16)

    def forward(self, x):
        from torch._higher_order_ops.map import map as control_map

        return control_map(lambda t: self.inner(t), x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("module, op", [(NormInABranch, "cond"), (NormInAMap, "map")], ids=["cond", "map"])
def test_a_norm_inside_a_control_flow_subgraph_is_reported_and_left(module, op, mode):
    """The pass rewrites the top-level graph; a norm in a subgraph gets a decision that says so, with its
    names qualified by the subgraph's, whatever the top level holds. Both branches are run."""
    module, inputs = module(), (sample(),)
    rewritten = rewrite(module, inputs, mode)
    inner = [d for d in rewritten.result.decisions if "." in d.mean]
    assert [(d.rebuilt, d.form) for d in inner] == [(False, "rsqrt+weight")], rewritten.result.decisions
    (decision,) = inner
    assert f"which {op}" in decision.reason and "top-level graph only" in decision.reason, decision.reason
    prefix = decision.mean.split(".")[0] + "."
    assert decision.input.startswith(prefix) and decision.weight.startswith(prefix), decision
    assert len(rms_norm_nodes(rewritten.graph_module)) == (1 if isinstance(module, NormInABranch) else 0)
    for args in (inputs, (-inputs[0],)):
        with torch.no_grad():
            assert compare(module(*args), rewritten.run(*args), ulps=2).ok
