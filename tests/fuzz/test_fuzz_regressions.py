"""Regression tests from what the fuzzer found, each built from its reproducer file.

* eps that rounds to zero in float16 (seed 2, case 1189): a core bug, fixed in core/match.py (rule 4): the
  norm is rebuilt with eps 0, so a row of zeros gives NaN as in the model.
* a square whose metadata lies about its shape (seed 1, case 3300, hostile "garbage-meta"): a core bug,
  fixed in core/recompose.py: computing the rebuilt node's metadata raised out of ``recompose_rms_norm``; the
  norm is now left with a reason.
* squares that overflow float16 (seed 1, case 3122): the fuzzer's bug. The generator drew inputs around
  100 for a case whose feeding norm computes in float16; a rebuilt norm computes in float32 and returns
  what float64 would where the model's own square overflows, as core/match.py's rule 7 documents.
* a grouped norm computed wholly in float16 (seed 1, case 1797): the fuzzer's bug. Its norm-by-norm
  check held the rebuilt node to 2 ulps of the decomposed norm, which rounds its square, mean, sum and
  inverse square root one by one and was itself 4.5 ulps off the exact norm, while the rebuilt node was
  within half an ulp of it. For a norm computed wholly in its dtype, the check now also accepts a rebuilt
  node within one ulp of the model's own norm computed exactly (the original nodes in float64, casts kept
  exact), a reference that a wrong input, weight or eps cannot match.
* a "rounded-scaled" near miss whose square read ``h.type_as(x)`` (seed 11, case 260): the fuzzer's bug,
  shown once two casts of one tensor to one dtype count as one tensor. The square's input was rounded to
  float16 exactly as the scaled copy was, so both held the same values and the norm was an RMSNorm; the
  generator now gives this near miss no cast before the square.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import export

import edgefuse
from edgefuse.fuzz.check import CHECKS
from edgefuse.fuzz.generate import FLOAT16_SCALES, computes_in_float16, generate
from edgefuse.fuzz.hostile import apply_damage
from edgefuse.fuzz.localize import NormCheck, pair, replay
from edgefuse.fuzz.render import build
from edgefuse.fuzz.spec import CastSpec, CaseSpec, NormSpec, Tail, WeightSpec
from edgefuse.fuzz.units import run_unit
from edgefuse.core.verify import Comparison, compare
from tests.harness import DIM_ORDER_MODES, exported

# --- eps that rounds to zero in float16 -----------------------------------------------------------------

#: eps-underflow-float16-capture-s2-c1189.py: x * rsqrt(1e-12 + mean(x * x)) in float16, a row of zeros.
EPS_UNDERFLOW = CaseSpec(
    seed=2, index=1189, shape=(3, 1, 17), dtype="float16",
    norm=NormSpec("executorch-llama", square="mul", eps=1e-12, eps_how="left", eps_dtype="float64", dims_style="list-pos",
                  mid=(CastSpec("type_as", "input"),), weight=WeightSpec("float16", kind="buffer", left=False, seed=21030)),
    zero_row=True, tails=(Tail("residual", value=3.0, seed=43234),), input_seed=915889,
)
#: eps-underflow-float16-capture-s2-c1189-min.py, the same case shrunk.
EPS_UNDERFLOW_MIN = CaseSpec(
    seed=2, index=1189, shape=(1, 4), dtype="float16",
    norm=NormSpec("executorch-llama", eps=1e-12, eps_dtype="float64", dims_style="list-pos"),
    zero_row=True, input_seed=915889,
)


class TinyEpsNorm(nn.Module):
    """The shrunk reproducer's module: 1e-12 is 0 in float16, where the model adds it."""

    def forward(self, x):
        m = (x.pow(2)).mean([1], keepdim=True)
        a = m + 1e-12
        r = torch.rsqrt(a)
        return x * r


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
@pytest.mark.parametrize("backend", ["aten", "qnn"])
def test_eps_that_is_zero_in_float16_is_rebuilt_as_zero_and_a_zero_row_stays_nan(mode, backend):
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.5, -1.0, 2.0, 0.25]], dtype=torch.float16)
    module = TinyEpsNorm()
    expected = module(x)
    target = exported(module, (x,), mode)
    result = edgefuse.recompose_rms_norm(target, backend=backend)
    [decision] = result.decisions
    assert decision.rebuilt and decision.eps == 0.0, decision
    actual = (target if mode == "capture" else target.module())(x)
    assert torch.isnan(expected[0]).all() and torch.isnan(actual[0]).all()
    assert compare(expected, actual).ok


def test_the_eps_underflow_cases_pass_every_check():
    results = run_unit([EPS_UNDERFLOW, EPS_UNDERFLOW_MIN], CHECKS)
    assert [r.unexportable for r in results] == [None, None]
    assert all(len(r.checks) == len(CHECKS) and r.rebuilt == len(CHECKS) for r in results)
    assert [f.detail for r in results for f in r.findings] == []


# --- a square whose metadata lies about its shape (fixed in the core) ---------------------------------------

#: hostile-exception-s1-c3300-garbage-meta-qnn-qc.py: a float16 norm feeding a CoreML-style norm.
GARBAGE_META = CaseSpec(
    seed=1, index=3300, shape=(2, 17), dtype="float16", near_miss="coreml", scale=3.0, zero_row=True, input_seed=676383,
    norm=NormSpec("coreml", weight=WeightSpec("float16", left=False, seed=41248)),
    feed=NormSpec("executorch-llama", pre=(CastSpec("method", "float32"),), square="mul", mid=(CastSpec("type_as", "input"),),
                  weight=WeightSpec("float16", left=False, seed=62860), post=(CastSpec("to", "input"),)),
    heads_view="view",
)
GARBAGE_DAMAGE = [("garbage", "clamp_min", "other-dtype"), ("garbage", "mul", "extra-dim"), ("garbage", "norm_weight", "list"),
                  ("garbage", "div", "none"), ("garbage", "type_as", "other-dtype")]


class LyingNorm(nn.Module):
    """lying-metadata-exception.py, the same failure written by hand."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(17))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h


@pytest.mark.parametrize("backend,capture", [("aten", False), ("qnn", False), ("qnn", True)])
def test_a_square_whose_metadata_lies_about_its_shape_gets_a_reason_not_a_traceback(backend, capture):
    gm = export(LyingNorm(), (torch.randn(2, 17),)).module()
    square = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.pow.Tensor_Scalar)
    value = square.meta["val"]
    square.meta["val"] = value.new_empty((*value.shape, 2))  # the square claims [2, 17, 2]
    [decision] = edgefuse.recompose_rms_norm(gm, backend=backend, quantization_capture=capture).decisions
    assert not decision.rebuilt and decision.reason


def test_the_garbage_metadata_case_gets_reasons_not_a_traceback():
    # The generated case and the damage its reproducer records.
    built = build([GARBAGE_META])
    for backend, capture in (("aten", False), ("qnn", False), ("qnn", True)):
        gm = apply_damage(export(built.module, built.inputs).module(), GARBAGE_DAMAGE)
        result = edgefuse.recompose_rms_norm(gm, backend=backend, quantization_capture=capture)
        assert all(d.rebuilt or d.reason for d in result.decisions)


# --- squares that overflow float16: the generator's bug, and the documented behaviour behind it -------------

#: The norm that fed case s1-c3122: a float32 model that normalizes in float16.
FLOAT16_FEED = NormSpec("scaleless", pre=(CastSpec("method", "float16"),), post=(CastSpec("type_as", "input"), CastSpec("to", "input")))


def test_cases_that_compute_in_float16_anywhere_draw_inputs_whose_squares_stay_in_range():
    assert computes_in_float16("float32", NormSpec("llama", pre=(CastSpec("to", "float64"),)), FLOAT16_FEED)
    for seed in (1, 2):
        for index in range(2000):
            spec = generate(seed, index)
            if computes_in_float16(spec.dtype, spec.norm, spec.feed):
                assert spec.scale in FLOAT16_SCALES, spec


class HalfNorm(nn.Module):
    """square-overflow-float16.py: a norm computed wholly in float16."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_a_rebuilt_float16_norm_returns_what_float64_would_where_the_models_square_overflows():
    # core/match.py, rule 7: rms_norm computes in float32, so it does not overflow where x.pow(2) in float16 does.
    x = torch.tensor([[300.0, 1.0, -2.0, 0.5], [0.5, 1.0, -2.0, 0.25]], dtype=torch.float16)
    gm = export(HalfNorm(), (x,)).module()
    assert [d.rebuilt for d in edgefuse.recompose_rms_norm(gm).decisions] == [True]
    wide = torch.nn.functional.rms_norm(x.double(), (4,), eps=1e-6).to(torch.float16)
    assert compare(wide, gm(x)).ok
    assert not compare(HalfNorm()(x), gm(x)).ok  # the model's own float16 square overflowed on row 0


# --- a norm computed wholly in float16: the rebuilt node rounds once, the decomposed one five times -------

#: norm-mismatch-s1-c1797-*.py: a bfloat16 model whose grouped norm (2 groups of 2) computes in float16.
GROUPED_HALF = CaseSpec(
    seed=1, index=1797, shape=(2, 4, 3, 4), dtype="bfloat16", scale=0.1, residual=True, input_seed=400223,
    norm=NormSpec("grouped", pre=(CastSpec("to", "float16"),), eps_how="left", groups=2, also_return_normalized=True,
                  mid=(CastSpec("to", "input"), CastSpec("to", "float16")),
                  weight=WeightSpec("bfloat16", kind="param", cast=CastSpec("type_as", "float32"), left=True, seed=22612)),
    heads_view="reshape", tails=(Tail("mul-scalar", value=2.0, seed=46782),),
)


class HalfGroupNorm(nn.Module):
    """The reproducer's norm: two groups of two values, every step rounded to float16."""

    def forward(self, x):
        h = x.reshape(2, 4, 3, 2, 2)
        return h * torch.rsqrt(1e-06 + h.pow(2).mean(-1, keepdim=True))


def test_a_rebuilt_half_norm_may_differ_from_its_twin_by_being_more_accurate():
    # The reproducer's input: x + r in bfloat16, rounded to float16.
    x, r = ((0.1 * torch.randn(2, 4, 3, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
            .to(torch.bfloat16) for seed in (400223, 400224))
    x = (x + r).to(torch.float16)
    program = export(HalfGroupNorm(), (x,))
    gm = program.module()
    result = edgefuse.recompose_rms_norm(gm)
    [decision] = result.decisions
    assert decision.rebuilt and tuple(decision.normalized_shape) == (2,), decision
    local = replay(program.module(), gm, pair(program.module(), gm, {decision.node: decision.mean}), (x,))
    [norm] = local.norms.values()
    exact = torch.nn.functional.rms_norm(x.reshape(2, 4, 3, 2, 2).double(), (2,), eps=1e-6)
    rebuilt, decomposed = gm(x).double(), HalfGroupNorm()(x).double()
    one_ulp = torch.finfo(torch.float16).eps * exact.abs().max()
    # The rebuilt node is the more accurate one, by more than the 2 ulps the twin comparison allows:
    assert (rebuilt - exact).abs().max() <= one_ulp / 2 < (decomposed - exact).abs().max()
    assert not norm.comparison.ok and norm.exact is not None and norm.ok, norm


def test_a_rebuilt_norm_off_the_exact_norm_is_still_a_mismatch():
    far = Comparison(True, True, max_error=3e-3, allowed=2.7e-3)
    assert not NormCheck("rms_norm", "mul", far, exact=(1.5e-3, 1e-3)).ok  # over one ulp off the exact norm
    assert not NormCheck("rms_norm", "mul", far, exact=None).ok  # the exception does not apply: the twin decides
    assert NormCheck("rms_norm", "mul", far, exact=(4e-4, 1e-3)).ok
    assert not NormCheck("rms_norm", None, None, exact=(4e-4, 1e-3)).ok  # unpaired: judged at the outputs


@pytest.mark.parametrize("wrong", ["weight", "eps", "input"])
def test_the_exact_reference_is_the_models_norm_not_the_rebuilt_nodes_arguments(wrong):
    # A rebuilt node with a wrong weight, eps or input lies close to a norm computed from its own
    # arguments; against the model's own norm computed exactly it is far off, and fails.
    class WeightedHalfNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 4, dtype=torch.float16))

        def forward(self, x):
            return x * torch.rsqrt(1e-06 + x.pow(2).mean(-1, keepdim=True)) * self.weight

    x = (0.1 * torch.randn(2, 4, 3, 4, generator=torch.Generator().manual_seed(3))).to(torch.float16)
    program = export(WeightedHalfNorm(), (x,))
    gm = program.module()
    [decision] = edgefuse.recompose_rms_norm(gm).decisions
    assert decision.rebuilt and decision.weight is not None
    node = next(n for n in gm.graph.nodes if n.name == decision.node)
    assert not replay(program.module(), gm, pair(program.module(), gm, {decision.node: decision.mean}), (x,)).norms[node.name].exact
    if wrong == "weight":
        node.args = (node.args[0], node.args[1], None, node.args[3])
    elif wrong == "eps":
        node.args = (*node.args[:3], 0.5)
    else:
        with gm.graph.inserting_before(node):
            node.args = (gm.graph.call_function(torch.ops.aten.add.Scalar, (node.args[0], 1.0)), *node.args[1:])
    gm.recompile()
    [norm] = replay(program.module(), gm, pair(program.module(), gm, {decision.node: decision.mean}), (x,)).norms.values()
    assert not norm.ok, norm


def test_the_grouped_half_norm_case_passes_every_check():
    [result] = run_unit([GROUPED_HALF], CHECKS)
    assert result.unexportable is None
    assert len(result.checks) == len(CHECKS) and result.rebuilt == len(CHECKS)
    assert [f.detail for f in result.findings] == []


# --- a near miss that was none: the square rounded as the scaled copy was -------------------------------

#: near-miss-rebuilt-s11-c260-*.py, the norm as generated before the fix: x float16, h = x in float32, the
#: square reads h.type_as(x) and the norm scales h rounded through float16, the same values.
ROUNDED_ALIKE = NormSpec(
    "llama", pre=(CastSpec("to", "float32"),), var_pre=(CastSpec("type_as", "input"),), scaled="rounded",
    rounded_via="float16", mid=(CastSpec("type_as", "input"),),
)


def test_a_square_rounded_as_the_scaled_copy_is_one_tensors_norm_and_no_near_miss():
    spec = CaseSpec(seed=11, index=260, shape=(4, 32), dtype="float16", norm=ROUNDED_ALIKE, input_seed=917800)
    [result] = run_unit([spec], CHECKS[:1])
    assert result.rebuilt == 1 and [f.detail for f in result.findings] == []  # rebuilt, and matches eager


def test_generated_rounded_scaled_near_misses_square_unrounded_values_and_stay():
    # The first such cases of two seeds, before and after the fix's change to them (seed 11, case 260).
    generated = (generate(seed, index) for seed in (11, 12) for index in range(1500))
    cases = [spec for spec in generated if spec.norm.scaled == "rounded"]
    assert len(cases) > 20 and any(s.norm.var_pre for s in cases)  # widening casts before the square remain
    assert any(s.index == 260 and s.seed == 11 for s in cases)
    for result in run_unit(cases[:24] + [s for s in cases if (s.seed, s.index) == (11, 260)], CHECKS[:1]):
        assert result.findings == [], [f.detail for f in result.findings]


class QkNorm(nn.Module):
    """A weighted QK norm over the last dim of [B, T, H, D], on the heads transposed or as they come."""

    def __init__(self, transposed: bool):
        super().__init__()
        self.transposed = transposed
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 32))

    def forward(self, x):
        h = x.transpose(1, 2) if self.transposed else x
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


@pytest.mark.parametrize(
    "mode, transposed",
    [("edge", False), ("capture", True)],  # QNN's float limit: a [1, rows, 32] view; rule 9: a permutation
)
def test_a_norm_rebuilt_with_views_or_a_permutation_after_it_is_paired_with_its_twin(mode, transposed):
    # The rewrite puts a view back (and rule 9 a permutation) after the rebuilt rms_norm: the node that
    # takes the twin's uses over is the last of them, and that is what the twin is compared with.
    x = torch.randn(2, 16, 4, 32, generator=torch.Generator().manual_seed(0))
    target = exported(QkNorm(transposed), (x,), mode)
    original = target.module() if mode != "capture" else export(QkNorm(transposed), (x,)).module()
    result = edgefuse.recompose_rms_norm(target, backend="qnn")
    [decision] = result.decisions
    assert decision.rebuilt and ("view of its input" in decision.note or "permuted by" in decision.note), decision
    gm = result.graph_module if mode == "capture" else target.module()
    twins = pair(original, gm, {decision.node: decision.mean})
    assert twins[decision.node] is not None, twins
    [norm] = replay(original, gm, twins, (x,)).norms.values()
    assert norm.ok and norm.comparison.max_error <= norm.comparison.allowed, norm
    # A wrong eps in the rebuilt node is still caught by the comparison with the twin.
    node = next(n for n in gm.graph.nodes if n.name == decision.node)
    node.args = (*node.args[:3], 0.5)
    gm.recompile()
    [norm] = replay(original, gm, pair(original, gm, {decision.node: decision.mean}), (x,)).norms.values()
    assert norm.twin is not None and not norm.ok, norm


class TwiceNormed(nn.Module):
    """``n(n(x))`` on [2, 16, 32]: under QNN's float limit, each norm is rebuilt on a rows view."""

    def forward(self, x):
        for _ in range(2):
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x


def test_a_norm_whose_view_back_feeds_the_next_norms_view_is_paired():
    # The first norm's view back is read by the second norm's rows view: the walk to the node that took
    # the twin's uses over stops at the view back, not inside the next norm.
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0))
    target = exported(TwiceNormed(), (x,), "edge")
    original = target.module()
    result = edgefuse.recompose_rms_norm(target, backend="qnn")
    assert [d.rebuilt for d in result.decisions] == [True, True], result.decisions
    gm = target.module()
    twins = pair(original, gm, {d.node: d.mean for d in result.decisions})
    assert None not in twins.values(), twins
    assert all(norm.ok for norm in replay(original, gm, twins, (x,)).norms.values())
