"""Every check can fail: each test feeds the check a deliberately wrong pass and names the one kind of
finding it must give, so that removing that part of the check fails the test; and what is no finding
(an ulp a later cube magnifies, a multiply that is not the weight) is not reported."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.export import export

import edgefuse
import edgefuse.core.match
import edgefuse.core.recompose
from edgefuse.fuzz.render import build
from edgefuse.fuzz.spec import CastSpec, CaseSpec, NormSpec, Tail, WeightSpec
from edgefuse.fuzz.units import run_unit
from tests.harness import rms_norm_nodes
from tests.fuzz.cases import CAPTURE, LLAMA, RENAMED, enter_renamed, finding_kinds


def _after_the_pass(monkeypatch, change):
    """Make ``edgefuse.recompose_rms_norm`` run the real pass, then ``change(result)``."""
    real = edgefuse.recompose_rms_norm

    def wrapped(target, **kwargs):
        result = real(target, **kwargs)
        change(result)
        return result

    monkeypatch.setattr(edgefuse, "recompose_rms_norm", wrapped)


def test_the_check_reports_an_exception_escaping_the_pass(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(edgefuse, "recompose_rms_norm", broken)
    results = run_unit([LLAMA], CAPTURE)
    assert finding_kinds(results) == {"exception"}
    assert len(results[0].findings) == 3 and "injected" in results[0].findings[0].detail


def _boom(x):
    raise RuntimeError("a program that no longer runs")


def test_the_check_reports_a_program_that_no_longer_runs(monkeypatch):
    def break_it(result):
        graph = result.graph_module.graph
        norm = rms_norm_nodes(result.graph_module)[0]
        with graph.inserting_after(norm):
            boom = graph.call_function(_boom, (norm,))
        norm.replace_all_uses_with(boom, delete_user_cb=lambda user: user is not boom)
        result.graph_module.recompile()

    _after_the_pass(monkeypatch, break_it)
    assert finding_kinds(run_unit([LLAMA], CAPTURE[:1])) == {"broken-program"}


def test_the_check_reports_a_changed_output_dtype(monkeypatch):
    def widen(result):
        graph = result.graph_module.graph
        output = next(n for n in graph.nodes if n.op == "output")
        first = output.args[0][0]
        with graph.inserting_before(output):
            cast = graph.call_function(torch.ops.aten.to.dtype, (first, torch.float64))
        cast.meta["val"] = first.meta["val"].to(torch.float64)
        output.args = ((cast, *output.args[0][1:]),)
        result.graph_module.recompile()

    _after_the_pass(monkeypatch, widen)
    assert finding_kinds(run_unit([LLAMA], CAPTURE[:1])) == {"dtype"}


def test_the_check_reports_a_change_outside_the_norms_and_does_not_excuse_it(monkeypatch):
    # The rebuilt norm is right, but the pass also changed a later multiply: only the outputs show it,
    # and the replay of the original graph on the rebuilt values does not reproduce it, so it is no
    # "amplification" of an allowed difference.
    def nudge(result):
        for node in result.graph_module.graph.nodes:
            if node.target == torch.ops.aten.mul.Tensor and node.args[1] == 2.0:
                node.args = (node.args[0], 2.0 * (1 + 2 ** -7))
        result.graph_module.recompile()

    _after_the_pass(monkeypatch, nudge)
    spec = dataclasses.replace(LLAMA, tails=(Tail("mul-scalar", value=2.0),))
    [result] = run_unit([spec], CAPTURE[:1])
    assert finding_kinds([result]) == {"mismatch"} and result.rebuilt == 1 and not result.amplified


def test_the_check_reports_a_dropped_rounding_at_the_output_and_norm_by_norm(monkeypatch):
    rounding = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, mid=(CastSpec("to", "bfloat16"), CastSpec("to", "input"))))
    assert not finding_kinds(run_unit([rounding], CAPTURE[:1]))  # the real rule 7 keeps it right ...
    monkeypatch.setattr(edgefuse.core.match, "at_least", lambda dtype, floor: True)
    [result] = run_unit([rounding], CAPTURE[:1])
    assert finding_kinds([result]) == {"mismatch", "norm-mismatch"}  # ... and a pass without it is caught,
    assert not result.amplified  # not excused as the model magnifying an allowed difference


def test_the_norm_by_norm_check_sees_a_dropped_rounding_that_a_later_rounding_hides(monkeypatch):
    # A float32 norm that rounds to bfloat16 inside, then the output is rounded to bfloat16 anyway: the
    # outputs differ by at most one bfloat16 unit, within their tolerance; the rebuilt norm itself does not.
    hidden = dataclasses.replace(
        LLAMA, norm=dataclasses.replace(LLAMA.norm, mid=(CastSpec("to", "bfloat16"), CastSpec("to", "input")), post=(CastSpec("to", "bfloat16"),))
    )
    assert not finding_kinds(run_unit([hidden], CAPTURE[:1]))
    monkeypatch.setattr(edgefuse.core.match, "at_least", lambda dtype, floor: True)
    [result] = run_unit([hidden], CAPTURE[:1])
    assert finding_kinds([result]) == {"norm-mismatch"} and result.rebuilt == 1


def _take_any_power_as_a_square(monkeypatch):
    """Break rule 2: ``pow(x, n)`` is taken as a square for any n, so a cube is rebuilt."""
    original = edgefuse.core.match._square_base

    def square_base(node, table, constants):
        return node.args[0] if table.role(node) is edgefuse.core.match.Role.POW else original(node, table, constants)

    monkeypatch.setattr(edgefuse.core.match, "_square_base", square_base)


def test_the_check_reports_a_rebuilt_near_miss(monkeypatch):
    _take_any_power_as_a_square(monkeypatch)
    cube = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, square="pow3"), near_miss="cube")
    results = run_unit([cube], CAPTURE[:1])
    assert "near-miss-rebuilt" in finding_kinds(results)


def test_the_check_reports_a_wrong_eps(monkeypatch):
    original = edgefuse.core.match._eps
    monkeypatch.setattr(edgefuse.core.match, "_eps", lambda *a: (lambda e: e * 10 if isinstance(e, float) else e)(original(*a)))
    small = dataclasses.replace(LLAMA, scale=1e-3, norm=dataclasses.replace(LLAMA.norm, eps=1e-5))
    assert "wrong-norm" in finding_kinds(run_unit([small], CAPTURE[:1]))


def test_the_check_reports_a_norm_rebuilt_with_eps_zero_where_the_model_adds_eps(monkeypatch):
    # 1e-8 underflows in float16 but not in float32, where this norm adds it: eps 0 would be wrong here.
    original = edgefuse.core.match._eps
    monkeypatch.setattr(edgefuse.core.match, "_eps", lambda *a: (lambda e: 0.0 if isinstance(e, float) else e)(original(*a)))
    tiny = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, eps=1e-8))
    assert "wrong-norm" in finding_kinds(run_unit([tiny], CAPTURE[:1]))


def test_the_check_reports_a_norm_the_pass_failed_to_read(monkeypatch):
    # recompose_rms_norm catches an exception inside and leaves the norm with a reason; on a graph nobody
    # damaged that is a bug, not a decision.
    def raises(*args, **kwargs):
        raise AttributeError("a bug in the matcher")

    monkeypatch.setattr(edgefuse.core.recompose, "match_rms_norm", raises)
    assert finding_kinds(run_unit([LLAMA], CAPTURE[:1])) == {"internal-error"}


def test_the_check_reports_a_wrong_normalized_shape(monkeypatch):
    def misreport(result):
        result.decisions[:] = [dataclasses.replace(d, normalized_shape=(8,)) if d.rebuilt else d for d in result.decisions]

    _after_the_pass(monkeypatch, misreport)
    assert finding_kinds(run_unit([LLAMA], CAPTURE[:1])) == {"wrong-norm"}


def test_the_check_reports_a_norm_left_without_a_reason(monkeypatch):
    def silence(result):
        result.decisions[:] = [dataclasses.replace(d, reason="") for d in result.decisions]

    _after_the_pass(monkeypatch, silence)
    near = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, square="pow3"), near_miss="cube")
    assert finding_kinds(run_unit([near], CAPTURE[:1])) == {"no-reason"}


def test_an_error_of_the_fuzzer_itself_is_reported_not_raised(monkeypatch):
    import edgefuse.fuzz.check as check

    monkeypatch.setattr(check, "_check_norms", lambda *a: 1 / 0)
    assert finding_kinds(run_unit([LLAMA], CAPTURE[:1])) == {"fuzzer-error"}


def test_side_by_side_findings_name_their_case(monkeypatch):
    _take_any_power_as_a_square(monkeypatch)
    cube = dataclasses.replace(LLAMA, index=1, norm=dataclasses.replace(LLAMA.norm, square="pow3"), near_miss="cube")
    results = run_unit([LLAMA, cube, dataclasses.replace(LLAMA, index=2)], CAPTURE[:1])
    assert [bool(r.findings) for r in results] == [False, True, False]
    assert all(f.spec.index == 1 for f in results[1].findings)


def test_a_functional_norm_in_an_edge_graph_is_attributed_to_its_case():
    # Edge graphs decompose F.rms_norm without a module path: the decision is found by its graph input.
    functional = NormSpec("functional", weight=WeightSpec("float32", seed=1))
    specs = [LLAMA, dataclasses.replace(LLAMA, index=1, norm=functional)]
    results = run_unit(specs, [("edge", "aten", False)])
    assert not finding_kinds(results) and [r.unattributed for r in results] == [0, 0]
    assert [r.rebuilt for r in results] == [1, 1] and [r.paired for r in results] == [1, 1]


@pytest.mark.parametrize("renamed", [False, True], ids=["functional", "renamed"])
def test_a_decision_without_a_module_path_is_the_case_s_functional_norm_under_any_name(renamed, monkeypatch):
    # An edge graph may decompose F.rms_norm without a module path: the decision is then the case's norm
    # whose registry entry is ``functional``, whatever its name, and is checked against that norm.
    from edgefuse.fuzz.check import functional_norm

    if renamed:
        enter_renamed(monkeypatch)
    functional = NormSpec(RENAMED["functional"] if renamed else "functional")
    assert functional_norm(dataclasses.replace(LLAMA, norm=functional)) == "norm"
    assert functional_norm(dataclasses.replace(LLAMA, feed=functional)) == "feed"
    assert functional_norm(dataclasses.replace(LLAMA, norm=functional, feed=functional)) is None
    assert functional_norm(LLAMA) is None


def test_a_cube_after_a_rebuilt_norm_magnifies_its_ulp_and_is_not_a_finding():
    # Seed 1 case 52: a bfloat16 norm (rebuilt, one ulp off the decomposed one) feeds
    # mean(x * x * x) + 1 under rsqrt, which magnifies that ulp far beyond any output tolerance.
    feed = NormSpec("rsqrt-method", inverse="rsqrt-method", post=(CastSpec("to", "input"),),
                    weight=WeightSpec("bfloat16", left=False, seed=29065))
    cube = NormSpec("t5", var_pre=(CastSpec("to", "float32"), CastSpec("to", "input")), square="mul3", eps=1.0,
                    weight=WeightSpec("float32", seed=59613), post=(CastSpec("to", "float32"),))
    spec = CaseSpec(seed=1, index=52, shape=(4, 16), dtype="bfloat16", norm=cube, feed=feed, scale=3.0,
                    near_miss="cube-mul", input_seed=171074)
    [result] = run_unit([spec], CAPTURE[:1])
    assert not result.findings and result.rebuilt == 1 and result.paired == 1
    [note] = result.amplified
    assert "bit for bit" in note


def test_a_weight_of_another_shape_is_never_the_weight():
    row = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, weight=dataclasses.replace(LLAMA.norm.weight, shape="row")))
    # a (16,) constant multiplied after a norm over (3, 16): a later multiply, not the weight
    wide = dataclasses.replace(LLAMA, index=1, shape=(2, 3, 16), tails=(Tail("mul-tensor", seed=5),),
                               norm=dataclasses.replace(LLAMA.norm, dims=2, weight=None))
    results = run_unit([row, wide], CAPTURE)
    assert not finding_kinds(results)
    built = build([row])
    gm = export(built.module, built.inputs).module()
    [decision] = edgefuse.recompose_rms_norm(gm).decisions
    assert decision.weight is None  # rebuilt without it, or left: the (1, D) multiply stays in the graph
    assert any(n.target == torch.ops.aten.mul.Tensor for n in gm.graph.nodes)

