"""The fuzzer: a seeded run finds nothing, the generator makes what it claims, every check can fail,
and malformed or hostile graphs get a reason from the pass, never a traceback."""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter

import pytest
import torch
from torch.export import Dim, export

import edgefuse
import edgefuse.core.match
import edgefuse.core.recompose
import edgefuse.runtime
import edgefuse.xnnpack
from edgefuse.fuzz import cli
from edgefuse.fuzz.check import CHECKS, Finding
from edgefuse.core import forms as registry
from edgefuse.fuzz.generate import features, generate, instance
from edgefuse.fuzz.hostile import run_hostile
from edgefuse.fuzz.malformed import check_malformed, malformed_graphs
from edgefuse.fuzz.edge_programs import cached_cia_ops, to_edge_program
from edgefuse.fuzz.render import build, norm_module, source
from edgefuse.fuzz.reproducer import read_specs, reproducer_text
from edgefuse.fuzz.runner import Options, run
from edgefuse.fuzz.spec import (
    CAST_KINDS,
    FORMS,
    INVERSES,
    NEAR_MISSES,
    SQUARES,
    CastSpec,
    CaseSpec,
    NormSpec,
    Tail,
    WeightSpec,
)
from edgefuse.fuzz.summary import FAILING, format_summary
from edgefuse.fuzz.units import run_unit
from edgefuse.fuzz.xnnpack import run_xnnpack
from edgefuse.core.verify import compare
from tests.harness import rewrite, rms_norm_nodes

SEED = 4
CAPTURE = [c for c in CHECKS if c[0] == "capture"]


def _first(predicate, seed=SEED, limit=3000) -> CaseSpec:
    """The first generated case of ``seed`` that satisfies ``predicate``."""
    for i in range(limit):
        spec = generate(seed, i)
        if predicate(spec):
            return spec
    raise AssertionError("the generator made no such case")


# --- the seeded run CI makes --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_seeded_run_has_no_mismatch_exception_or_rebuilt_near_miss():
    # What CI runs: 40 cases, edge modes on 8 of them, damaged variants of 2, the malformed set, and the
    # XNNPACK flow on 1 (one test, not a fixture shared by several, so that pytest-xdist runs it once).
    options = Options(seed=SEED, cases=40, batch=40, edge_every=5, hostile_every=20, xnnpack_every=40,
                      malformed=True, out=None, progress_seconds=1e9)
    summary = run(options)
    text = format_summary(summary)
    assert not summary.failed, text
    assert summary.generated == 40
    assert sum(r.unexportable is not None for r in summary.results) <= 2, text
    by_mode = summary.checks_by_mode()
    assert by_mode["capture/aten"] >= 38 and by_mode["capture/qnn+quantization-capture"] >= 38, text
    assert by_mode["edge/qnn"] >= 6 and by_mode["edge-no-dim-order/aten"] >= 6, text
    # The run exercised the pass, not just its refusals: norms were rebuilt, compared one by one, and
    # near misses were seen.
    assert sum(r.rebuilt for r in summary.results) >= 20, text
    assert sum(r.paired for r in summary.results) >= 20 and sum(r.unpaired for r in summary.results) == 0, text
    assert sum(r.spec.near_miss is not None for r in summary.results) >= 5, text
    assert summary.hostile_cases == 2 and summary.malformed_checked >= 30, text
    assert sum(bool(r.checks) for r in summary.xnnpack_results) == 1, text
    for label in ("generated", "rebuilt", "left", "mismatches", "exceptions", "near-misses rebuilt", "unexportable",
                  "xnnpack sample", "hostile graphs", "malformed graphs"):
        assert f"\n{label} " in f"\n{text}", text
    assert "result: OK" in text


def test_the_command_line_exits_zero_and_writes_nothing_when_nothing_fails(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--cases", "3", "--start", "1", "--seed", "11", "--edge-every", "1000", "--progress", "0", "-q"]) == 0
    out, err = capsys.readouterr()
    assert "edgefuse fuzz:" not in err and "cases/s" not in err, err  # -q: no header, no progress
    assert "generated            3 cases" in out and "mismatches           0" in out
    assert list(tmp_path.iterdir()) == []  # the reproducer directory is created only when a case fails


def test_the_command_line_exits_one_on_a_finding_and_writes_reproducers(capsys, monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(edgefuse, "recompose_rms_norm", broken)
    argv = ["--cases", "1", "--start", "1", "--seed", "11", "--edge-every", "1000", "--shrink", "0"]
    assert cli.main(argv) == 1
    assert "exceptions           3" in capsys.readouterr().out
    assert len(list((tmp_path / "edgefuse-fuzz-failures").glob("exception-*.py"))) == 3


@pytest.mark.parametrize("argv", [["--cases", "0"], ["--jobs", "0"], ["--start", "-5"], ["--hostile-every", "-1"]])
def test_numbers_out_of_range_are_usage_errors(argv, capsys):
    assert cli.main(argv) == 2
    assert "non-negative ones" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ['{"foo": 1}', "[1, 2]", "[]", '{"__type__": "Nope"}', '{"__type__": "CaseSpec", "bogus": 1}'])
def test_replaying_a_spec_the_fuzzer_did_not_write_is_a_usage_error(spec, capsys, tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(f"SPEC = {spec}\n")
    assert cli.main(["--replay", str(path)]) == 2
    assert "its SPEC is not a list of cases the fuzzer wrote" in capsys.readouterr().err


def test_replaying_a_case_with_values_the_fuzzer_never_writes_is_a_usage_error(capsys, tmp_path):
    from dataclasses import replace

    from edgefuse.fuzz.spec import CaseSpec, NormSpec, to_dict

    case = CaseSpec(seed=0, index=0, shape=(2, 16), dtype="float32", norm=NormSpec("llama"))
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(f"SPEC = {[to_dict(case)]!r}\n")
    bad.write_text(f"SPEC = {[to_dict(replace(case, dtype='float99'))]!r}\n")
    assert cli.main(["--replay", str(good)]) == 0
    assert cli.main(["--replay", str(bad)]) == 2
    assert "SPEC[0].dtype: 'float99' is not one of float32" in capsys.readouterr().err


# --- the generator ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def population():
    return [generate(SEED, i) for i in range(1500)]


def test_the_generator_makes_every_form_near_miss_cast_and_neighbour(population):
    seen = Counter(f for spec in population for f in features(spec))
    wanted = [f"form:{form}" for form in FORMS]
    wanted += [f"near-miss:{kind}" for kind in NEAR_MISSES]
    wanted += [f"cast:{kind}" for kind in CAST_KINDS]
    wanted += [f"cast-dtype:{d}" for d in ("float32", "float16", "bfloat16", "float64")]
    wanted += [f"dtype:{d}" for d in ("float32", "float16", "bfloat16", "float64")]
    wanted += [f"rank:{r}" for r in (2, 3, 4, 5)]
    wanted += [
        f"neighbour:{n}"
        for n in ("residual-in", "feed-norm", "heads-view", "heads-reshape", "grouped-reshape", "mul-scalar", "mul-0d",
                  "mul-tensor", "residual", "extra-output")
    ]
    wanted += ["channels-last", "normalized-dims:2", "input:zero-row", "weight:none", "weight:input", "weight:buffer",
               "weight:offset", "weight:row-shape", "eps:left", "eps:const", "eps:none"]
    wanted += [f"square:{s}" for s in SQUARES]
    wanted += [f"inverse:{i}" for i in INVERSES]
    wanted += [f"dims:{d}" for d in ("neg", "pos", "list-neg", "list-pos")]
    missing = [w for w in wanted if seen[w] < 3]
    assert not missing, missing


def test_the_generator_makes_every_root_the_matcher_labels(population):
    """Every root the matcher labels (edgefuse.core.forms.ROOTS), in a case that is no near miss, and every
    form of the registry: a form the matcher accepts is never one the fuzzer cannot write."""
    roots, forms = set(), set()
    for spec in population:
        if spec.near_miss is None:
            forms.add(spec.norm.form)
            spelling = registry.SPELLINGS.get(spec.norm.inverse)
            if spelling is not None and not registry.FORMS[spec.norm.form].functional:
                roots.add(spelling.root)
    missing = {root.label for root in registry.ROOTS} - roots
    assert not missing, f"the matcher labels {sorted(missing)}, which the fuzzer never generates"
    assert set(registry.FORMS) <= forms, sorted(set(registry.FORMS) - forms)


@pytest.mark.parametrize("form", registry.FORMS)
def test_the_matcher_labels_each_form_the_fuzzer_writes_as_the_registry_says(form):
    """The fuzzer's instance of each registry form is rebuilt, under the registry's label (F.rms_norm in
    an edge graph, which decomposes it)."""
    entry = registry.FORMS[form]
    module = norm_module(instance(form, "float32", seed=1), (3, 16))
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    [decision] = rewrite(module, (x,), "edge" if entry.functional else "capture").result.decisions
    assert decision.rebuilt, decision.reason
    assert decision.form == entry.label


@pytest.mark.parametrize("spelling", registry.SPELLINGS)
def test_each_root_the_fuzzer_writes_gets_its_label(spelling):
    """Each spelling of a root, in a Llama norm, is rebuilt under its root's label."""
    norm = dataclasses.replace(instance("llama", "float32", seed=1), inverse=spelling)
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    [decision] = rewrite(norm_module(norm, (3, 16)), (x,), "capture").result.decisions
    assert decision.rebuilt, decision.reason
    assert decision.form == registry.label(registry.SPELLINGS[spelling].root, False, True)


def test_the_renderer_writes_each_registry_spelling_and_square_as_the_registry_does():
    """The renderer's snippets are keyed by name: every spelling and square the spec accepts has one,
    and a registry name is written with the registry's own text (a table zipped by position would
    give a new spelling another's)."""
    from edgefuse.fuzz import render
    from edgefuse.fuzz.spec import NEAR_MISS_SQUARES

    assert set(render.INVERSE_SOURCE) == set(INVERSES)
    assert set(render.SQUARE_SOURCE) == set(SQUARES) | set(NEAR_MISS_SQUARES)
    for name, spelling in registry.SPELLINGS.items():
        assert render.INVERSE_SOURCE[name] == spelling.source.format(a="a")
        assert (name in render.DIVIDES) == spelling.divides
    for name, text in registry.SQUARES.items():
        assert render.SQUARE_SOURCE[name] == text.format(v="v")


#: Registry forms entered again under new names, each with the fields of the form it copies.
RENAMED = {"grouped": "split-width", "functional": "one-call", "scaleless": "unscaled"}


def _renamed(spec: CaseSpec) -> CaseSpec:
    """``spec`` with its norms' forms under their :data:`RENAMED` names."""
    def rename(norm):
        return dataclasses.replace(norm, form=RENAMED.get(norm.form, norm.form))

    return dataclasses.replace(spec, norm=rename(spec.norm), feed=spec.feed and rename(spec.feed))


def _enter_renamed(monkeypatch) -> None:
    """Give the registry's forms their :data:`RENAMED` names, each in its own place and with its fields."""
    from edgefuse.fuzz import spec as spec_module

    forms = {RENAMED.get(name, name): dataclasses.replace(form, name=RENAMED.get(name, name))
             for name, form in registry.FORMS.items()}
    monkeypatch.setattr(registry, "FORMS", forms)
    monkeypatch.setattr(spec_module, "FORMS", (*forms, "coreml"))


def test_a_new_form_made_of_existing_pieces_needs_no_edit_of_the_fuzzer(monkeypatch):
    """The fuzzer branches on a form's fields (its groups, whether it is ``F.rms_norm``, whether it has a
    weight), never on its name: with grouped, functional and scaleless entered under new names in their
    own places (so every random draw is the same), each case is generated, described, validated, shrunk
    and rendered as the same case under the old name."""
    from edgefuse.fuzz import shrink, validate
    from edgefuse.fuzz.render import describe
    from edgefuse.fuzz.spec import to_dict

    def seen(case):
        return (case, features(case), describe(case), source([case]), list(shrink.candidates(case)))

    cases = [generate(SEED, i) for i in range(600)]
    before = [seen(case) for case in cases]
    counts = Counter(c.norm.form for c in cases if c.near_miss is None)
    assert all(counts[form] >= 10 for form in RENAMED), counts  # each renamed form is made, often
    assert {c.norm.groups for c in cases if c.norm.form == "grouped"} > {2}  # the split is drawn, not the entry's
    assert any(c.feed is not None and c.feed.form in RENAMED for c in cases)

    _enter_renamed(monkeypatch)

    def under_new_names(text):
        for old, new in RENAMED.items():
            text = text.replace(f"{old} norm", f"{new} norm")
        return text

    for i, (case, feats, line, text, smaller) in enumerate(before):
        made = generate(SEED, i)
        assert made == _renamed(case), i
        assert features(made) == {f"form:{RENAMED.get(f[5:], f[5:])}" if f.startswith("form:") else f for f in feats}
        assert describe(made) == under_new_names(line)
        assert source([made]) == under_new_names(text), i
        assert list(shrink.candidates(made)) == [_renamed(c) for c in smaller], i
        assert validate.cases([to_dict(made)]) == [made], i


def test_the_generator_draws_many_eps_values(population):
    eps = {spec.norm.eps for spec in population if spec.near_miss is None and spec.norm.eps is not None}
    assert {0.0, 1e-6, 1e-5, 1.0} <= eps and len(eps) > 50


def test_about_a_third_of_the_cases_are_near_misses(population):
    share = sum(spec.near_miss is not None for spec in population) / len(population)
    assert 0.2 < share < 0.4


def test_each_form_and_near_miss_builds_and_runs_in_eager(population):
    firsts = {}
    for spec in population:
        firsts.setdefault(("form", spec.norm.form), spec)
        firsts.setdefault(("near", spec.near_miss), spec)
    for key, spec in firsts.items():
        built = build([spec])
        out = built.module(*built.inputs)
        assert isinstance(out, tuple) and all(isinstance(t, torch.Tensor) for t in out), key


def test_a_case_is_a_pure_function_of_seed_and_index():
    assert generate(3, 17) == generate(3, 17)
    assert source([generate(3, 17)]) == source([generate(3, 17)])
    assert generate(3, 17) != generate(4, 17) and generate(3, 17) != generate(3, 18)
    a, b = build([generate(3, 17)]), build([generate(3, 17)])
    for x, y in zip([*a.module(*a.inputs), *a.module.state_dict().values()], [*b.module(*b.inputs), *b.module.state_dict().values()]):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)


def test_near_misses_are_not_the_rms_norm_of_their_input():
    # By construction: the near-miss module computes something else than an rms_norm of its input.
    spec = _first(lambda s: s.near_miss == "cube" and s.feed is None and not s.tails and s.norm.weight is None
                  and s.heads == 1 and not s.residual)
    built = build([spec])
    x = built.inputs[0]
    out = built.module(*built.inputs)[0]
    assert not torch.allclose(out.double(), torch.nn.functional.rms_norm(x.double(), (x.shape[-1],), eps=1e-6), atol=1e-2)


# --- every check can fail -----------------------------------------------------------------------------
# Each test feeds the check a deliberately wrong pass and names the one kind of finding it must give, so
# that removing that part of the check fails the test.


LLAMA = CaseSpec(
    seed=0, index=0, shape=(3, 16), dtype="float32",
    norm=NormSpec("llama", pre=(CastSpec("to", "float32"),), mid=(CastSpec("to", "input"),), weight=WeightSpec("float32", seed=3)),
)


def _kinds(results) -> set[str]:
    return {f.kind for r in results for f in r.findings}


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
    assert _kinds(results) == {"exception"}
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
    assert _kinds(run_unit([LLAMA], CAPTURE[:1])) == {"broken-program"}


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
    assert _kinds(run_unit([LLAMA], CAPTURE[:1])) == {"dtype"}


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
    assert _kinds([result]) == {"mismatch"} and result.rebuilt == 1 and not result.amplified


def test_the_check_reports_a_dropped_rounding_at_the_output_and_norm_by_norm(monkeypatch):
    rounding = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, mid=(CastSpec("to", "bfloat16"), CastSpec("to", "input"))))
    assert not _kinds(run_unit([rounding], CAPTURE[:1]))  # the real rule 7 keeps it right ...
    monkeypatch.setattr(edgefuse.core.match, "at_least", lambda dtype, floor: True)
    [result] = run_unit([rounding], CAPTURE[:1])
    assert _kinds([result]) == {"mismatch", "norm-mismatch"}  # ... and a pass without it is caught,
    assert not result.amplified  # not excused as the model magnifying an allowed difference


def test_the_norm_by_norm_check_sees_a_dropped_rounding_that_a_later_rounding_hides(monkeypatch):
    # A float32 norm that rounds to bfloat16 inside, then the output is rounded to bfloat16 anyway: the
    # outputs differ by at most one bfloat16 unit, within their tolerance; the rebuilt norm itself does not.
    hidden = dataclasses.replace(
        LLAMA, norm=dataclasses.replace(LLAMA.norm, mid=(CastSpec("to", "bfloat16"), CastSpec("to", "input")), post=(CastSpec("to", "bfloat16"),))
    )
    assert not _kinds(run_unit([hidden], CAPTURE[:1]))
    monkeypatch.setattr(edgefuse.core.match, "at_least", lambda dtype, floor: True)
    [result] = run_unit([hidden], CAPTURE[:1])
    assert _kinds([result]) == {"norm-mismatch"} and result.rebuilt == 1


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
    assert "near-miss-rebuilt" in _kinds(results)


def test_the_check_reports_a_wrong_eps(monkeypatch):
    original = edgefuse.core.match._eps
    monkeypatch.setattr(edgefuse.core.match, "_eps", lambda *a: (lambda e: e * 10 if isinstance(e, float) else e)(original(*a)))
    small = dataclasses.replace(LLAMA, scale=1e-3, norm=dataclasses.replace(LLAMA.norm, eps=1e-5))
    assert "wrong-norm" in _kinds(run_unit([small], CAPTURE[:1]))


def test_the_check_reports_a_norm_rebuilt_with_eps_zero_where_the_model_adds_eps(monkeypatch):
    # 1e-8 underflows in float16 but not in float32, where this norm adds it: eps 0 would be wrong here.
    original = edgefuse.core.match._eps
    monkeypatch.setattr(edgefuse.core.match, "_eps", lambda *a: (lambda e: 0.0 if isinstance(e, float) else e)(original(*a)))
    tiny = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, eps=1e-8))
    assert "wrong-norm" in _kinds(run_unit([tiny], CAPTURE[:1]))


def test_eps_zero_is_allowed_only_where_the_model_adds_an_eps_that_is_zero_there():
    from edgefuse.fuzz.tolerance import eps_values

    f32 = NormSpec("llama", pre=(CastSpec("to", "float32"),), eps=1e-8)
    assert 0.0 not in eps_values(f32, "float16")  # 1e-8 is 0 in float16, but this norm adds it in float32
    assert 1e-8 in eps_values(f32, "float16") and float(torch.tensor(1e-8)) in eps_values(f32, "float16")
    half = NormSpec("llama", pre=(CastSpec("to", "input"),), eps=1e-12)
    assert 0.0 in eps_values(half, "float16")  # added in float16, where it is 0
    const = NormSpec("llama", eps=1e-12, eps_how="const", eps_dtype="float64")
    assert 0.0 not in eps_values(const, "float16")  # a float64 [1] tensor promotes the sum to float64
    assert 0.0 in eps_values(dataclasses.replace(const, eps_dtype="float16"), "float32")  # stored as 0


def test_the_check_reports_a_norm_the_pass_failed_to_read(monkeypatch):
    # recompose_rms_norm catches an exception inside and leaves the norm with a reason; on a graph nobody
    # damaged that is a bug, not a decision.
    def raises(*args, **kwargs):
        raise AttributeError("a bug in the matcher")

    monkeypatch.setattr(edgefuse.core.recompose, "match_rms_norm", raises)
    assert _kinds(run_unit([LLAMA], CAPTURE[:1])) == {"internal-error"}


def test_the_check_reports_a_wrong_normalized_shape(monkeypatch):
    def misreport(result):
        result.decisions[:] = [dataclasses.replace(d, normalized_shape=(8,)) if d.rebuilt else d for d in result.decisions]

    _after_the_pass(monkeypatch, misreport)
    assert _kinds(run_unit([LLAMA], CAPTURE[:1])) == {"wrong-norm"}


def test_the_check_reports_a_norm_left_without_a_reason(monkeypatch):
    def silence(result):
        result.decisions[:] = [dataclasses.replace(d, reason="") for d in result.decisions]

    _after_the_pass(monkeypatch, silence)
    near = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, square="pow3"), near_miss="cube")
    assert _kinds(run_unit([near], CAPTURE[:1])) == {"no-reason"}


def test_an_error_of_the_fuzzer_itself_is_reported_not_raised(monkeypatch):
    import edgefuse.fuzz.check as check

    monkeypatch.setattr(check, "_check_norms", lambda *a: 1 / 0)
    assert _kinds(run_unit([LLAMA], CAPTURE[:1])) == {"fuzzer-error"}


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
    assert not _kinds(results) and [r.unattributed for r in results] == [0, 0]
    assert [r.rebuilt for r in results] == [1, 1] and [r.paired for r in results] == [1, 1]


@pytest.mark.parametrize("renamed", [False, True], ids=["functional", "renamed"])
def test_a_decision_without_a_module_path_is_the_case_s_functional_norm_under_any_name(renamed, monkeypatch):
    # An edge graph may decompose F.rms_norm without a module path: the decision is then the case's norm
    # whose registry entry is ``functional``, whatever its name, and is checked against that norm.
    from edgefuse.fuzz.check import functional_norm

    if renamed:
        _enter_renamed(monkeypatch)
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


def test_the_cached_op_list_does_not_change_the_edge_graph():
    built = build([generate(SEED, 0)])
    program = export(built.module, built.inputs)
    with cached_cia_ops():
        first = to_edge_program(program, "edge")  # fills the cache: the plain computation
        second = to_edge_program(program, "edge")  # reads it
    assert second.graph_module.code == first.graph_module.code


# --- the XNNPACK sample -------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_xnnpack_check_reports_a_pte_that_computes_something_else(monkeypatch):
    real = edgefuse.runtime.LoadedProgram.run
    calls = []

    def first_one_off(self, inputs):  # edgefuse's program runs first, stock's (if asked) after it
        calls.append(1)
        out = real(self, inputs)
        return [t * 1.01 for t in out] if len(calls) == 1 else out

    monkeypatch.setattr(edgefuse.runtime.LoadedProgram, "run", first_one_off)
    [result] = run_xnnpack([LLAMA])
    assert _kinds([result]) == {"xnnpack-mismatch"} and len(calls) == 2


@pytest.mark.slow
def test_the_xnnpack_check_reports_a_lowering_that_raises(monkeypatch):
    def broken(program, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(edgefuse.xnnpack, "lower", broken)
    [result] = run_xnnpack([LLAMA])
    assert _kinds([result]) == {"xnnpack-exception"} and "injected" in result.findings[0].detail


# --- reproducers --------------------------------------------------------------------------------------


def _run_reproducer(text: str, tmp_path, name: str) -> int:
    path = tmp_path / name
    path.write_text(text)
    namespace = {"__name__": "reproducer", "__file__": str(path)}
    exec(compile(text, str(path), "exec"), namespace)
    return namespace["main"]()


def test_a_reproducer_rebuilds_the_case_without_the_generator(tmp_path, capsys):
    spec = _first(lambda s: s.near_miss is None and s.feed is not None and s.norm.weight is not None)
    finding = Finding("mismatch", ("capture", "qnn", True), "(no bug: a test of the file format)", spec)
    text = reproducer_text(finding)
    assert "edgefuse.fuzz.generate" not in text and "edgefuse.fuzz.render" not in text
    assert _run_reproducer(text, tmp_path, "repro.py") == 0
    assert "OK: the check passes" in capsys.readouterr().out
    assert read_specs(tmp_path / "repro.py") == [spec]


def test_a_reproducer_fails_while_the_bug_is_there(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(edgefuse.core.match, "at_least", lambda dtype, floor: True)
    rounding = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, mid=(CastSpec("to", "bfloat16"), CastSpec("to", "input"))))
    finding = Finding("norm-mismatch", ("capture", "aten", False), "(a dropped rounding)", rounding)
    assert _run_reproducer(reproducer_text(finding), tmp_path, "repro.py") == 1
    assert "FAIL: the rebuilt" in capsys.readouterr().out


def test_a_reproducer_keeps_nan_and_inf_eps(tmp_path):
    spec = _first(lambda s: s.near_miss == "bad-eps" and s.norm.eps != s.norm.eps)
    path = tmp_path / "nan.py"
    path.write_text(reproducer_text(Finding("exception", ("capture", "aten", False), "x", spec)))
    [back] = read_specs(path)
    assert back.norm.eps != back.norm.eps and dataclasses.replace(back, norm=spec.norm) == spec


def test_a_hostile_reproducer_replays_the_damage_by_node_name(tmp_path, capsys):
    built = build([LLAMA])
    graph = export(built.module, built.inputs).module().graph
    names = [n.name for n in graph.nodes if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)]
    damage = (("opaque-after", names[0]), ("strip", names[1]), ("strip", names[-1]))
    finding = Finding("hostile-mismatch", ("unknown-op", "qnn", False), "(no bug: a test of the format)", LLAMA, damage=damage)
    text = reproducer_text(finding)
    assert f"DAMAGE = {list(damage)!r}" in text and "def apply_damage" in text
    assert _run_reproducer(text, tmp_path, "hostile.py") == 0
    assert "OK: the check passes" in capsys.readouterr().out
    assert read_specs(tmp_path / "hostile.py") == [LLAMA]


def test_an_xnnpack_reproducer_is_python_that_lowers_with_edgefuse():
    text = reproducer_text(Finding("xnnpack-mismatch", ("xnnpack", "edgefuse", False), "(format)", LLAMA))
    compile(text, "xnnpack.py", "exec")
    assert "lower(detached(program))" in text and "Runtime.get().load_program" in text


# --- malformed and hostile input ----------------------------------------------------------------------


@pytest.mark.parametrize("item", list(malformed_graphs()), ids=[m.name for m in malformed_graphs()])
@pytest.mark.parametrize("backend", ["aten", "qnn"])
def test_a_malformed_graph_gets_reasons_not_a_traceback(item, backend):
    assert check_malformed(item, backend, False) is None


def test_the_malformed_check_reports_a_traceback_a_missing_reason_and_a_rebuilt_nan_eps(monkeypatch):
    nan_eps = next(m for m in malformed_graphs() if m.name == "eps is nan")
    real = edgefuse.recompose_rms_norm
    monkeypatch.setattr(edgefuse, "recompose_rms_norm", lambda *a, **k: 1 / 0)
    assert "ZeroDivisionError" in check_malformed(nan_eps, "aten", False)

    def rebuilt(*a, **k):
        result = real(*a, **k)
        result.decisions[:] = [dataclasses.replace(d, rebuilt=True) for d in result.decisions]
        return result

    monkeypatch.setattr(edgefuse, "recompose_rms_norm", rebuilt)
    assert "rebuilt" in check_malformed(nan_eps, "aten", False)

    def silent(*a, **k):
        result = real(*a, **k)
        result.decisions[:] = [dataclasses.replace(d, reason=None) for d in result.decisions]
        return result

    monkeypatch.setattr(edgefuse, "recompose_rms_norm", silent)
    assert "without a reason" in check_malformed(nan_eps, "aten", False)


@pytest.mark.parametrize("mode", ["capture", "edge"])
def test_graphs_without_tensor_metadata_leave_every_norm_with_a_reason(mode):
    specs = [_first(lambda s: s.near_miss is None and s.norm.form == form) for form in ("llama", "gemma", "t5", "functional")]
    built = build(specs)
    program = export(built.module, built.inputs)
    target = program.module() if mode == "capture" else to_edge_program(program, mode)
    graph = target.graph if mode == "capture" else target.graph_module.graph
    for node in graph.nodes:
        node.meta.pop("val", None)
    for backend in ("aten", "qnn"):
        result = edgefuse.recompose_rms_norm(copy.deepcopy(target), backend=backend)
        assert result.decisions and all(not d.rebuilt and "meta['val']" in d.reason for d in result.decisions)


def test_a_symbolic_width_gets_a_reason_and_symbolic_rows_still_match():
    spec = dataclasses.replace(LLAMA, shape=(3, 5, 16), dtype="float16", norm=dataclasses.replace(LLAMA.norm, weight=None))
    built = build([spec])
    wide = export(built.module, built.inputs, dynamic_shapes=({2: Dim("width", min=2, max=64)},))
    result = edgefuse.recompose_rms_norm(wide.module())
    assert result.decisions and all(not d.rebuilt and "symbolic" in d.reason for d in result.decisions)
    rows = export(built.module, built.inputs, dynamic_shapes=({0: Dim("rows", min=2, max=64)},)).module()
    assert [d.rebuilt for d in edgefuse.recompose_rms_norm(rows).decisions] == [True]
    for n in (2, 7, 64):
        x = torch.randn(n, 5, 16, generator=torch.Generator().manual_seed(n)).to(torch.float16)
        assert compare(built.module(x)[0], rows(x)[0]).ok


@pytest.mark.parametrize("mode", ["capture", "edge-no-dim-order"])
def test_nan_and_inf_eps_are_left_with_a_reason(mode):
    specs = [
        CaseSpec(seed=0, index=i, shape=(2, 8), dtype=dtype, near_miss="bad-eps",
                 norm=dataclasses.replace(LLAMA.norm, eps=eps, eps_how=how, eps_dtype="float32"))
        for i, (eps, how, dtype) in enumerate(
            [(float("nan"), "right", "float32"), (float("inf"), "left", "float16"), (float("-inf"), "right", "bfloat16"),
             (float("nan"), "const", "float16"), (float("inf"), "const", "float32")]
        )
    ]
    built = build(specs)
    program = export(built.module, built.inputs)
    target = program.module() if mode == "capture" else to_edge_program(program, mode)
    for backend in ("aten", "qnn"):
        result = edgefuse.recompose_rms_norm(copy.deepcopy(target), backend=backend)
        assert len(result.decisions) == len(specs)
        assert all(not d.rebuilt and "finite" in d.reason for d in result.decisions), result.decisions


def test_a_weight_of_another_shape_is_never_the_weight():
    row = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, weight=dataclasses.replace(LLAMA.norm.weight, shape="row")))
    # a (16,) constant multiplied after a norm over (3, 16): a later multiply, not the weight
    wide = dataclasses.replace(LLAMA, index=1, shape=(2, 3, 16), tails=(Tail("mul-tensor", seed=5),),
                               norm=dataclasses.replace(LLAMA.norm, dims=2, weight=None))
    results = run_unit([row, wide], CAPTURE)
    assert not _kinds(results)
    built = build([row])
    gm = export(built.module, built.inputs).module()
    [decision] = edgefuse.recompose_rms_norm(gm).decisions
    assert decision.weight is None  # rebuilt without it, or left: the (1, D) multiply stays in the graph
    assert any(n.target == torch.ops.aten.mul.Tensor for n in gm.graph.nodes)


def test_hostile_variants_of_generated_cases_get_reasons_and_keep_outputs():
    specs = [_first(lambda s: s.near_miss is None and s.norm.form == "gemma" and s.shape[0] > 1)]
    specs.append(_first(lambda s: s.near_miss is not None and s.feed is not None))
    variants: Counter = Counter()
    for spec in specs:
        result = run_hostile(spec)
        variants.update(result.variants)
        assert not result.findings, [f"{f.kind} {f.check}: {f.detail[-500:]}" for f in result.findings]
    for name in ("aten-program", "strip-meta-all", "strip-meta-some", "garbage-meta", "unknown-op", "second-pass",
                 "after-cast-removal", "symbolic-lead"):
        assert variants[name] >= 3, variants


def test_the_hostile_check_reports_an_exception_and_a_mismatch(monkeypatch):
    real = edgefuse.recompose_rms_norm
    calls = []

    def flaky(target, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        result = real(target, **kwargs)
        for node in rms_norm_nodes(result.graph_module):
            node.args = (node.args[0], node.args[1], node.args[2], 0.5)  # another eps
        result.graph_module.recompile()
        return result

    monkeypatch.setattr(edgefuse, "recompose_rms_norm", flaky)
    result = run_hostile(LLAMA)
    kinds = Counter(f.kind for f in result.findings)
    assert kinds["hostile-exception"] == 1 and kinds["hostile-mismatch"] >= 1, kinds


def test_an_unknown_op_between_cast_and_norm_is_never_walked_past():
    half = dataclasses.replace(LLAMA.norm, weight=dataclasses.replace(LLAMA.norm.weight, dtype="float16"))
    built = build([dataclasses.replace(LLAMA, dtype="float16", norm=half)])
    gm = export(built.module, built.inputs).module()
    upcast = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.to.dtype)
    with gm.graph.inserting_after(upcast):
        opaque = gm.graph.call_function(torch.ops.edgefuse_fuzz.opaque.default, (upcast,))
    opaque.meta["val"] = upcast.meta["val"]
    upcast.replace_all_uses_with(opaque, delete_user_cb=lambda user: user is not opaque)
    gm.recompile()
    [decision] = edgefuse.recompose_rms_norm(gm).decisions
    # The norm reads the opaque op's float32 output and casts back to float16: no float16 tensor holds it.
    assert not decision.rebuilt and rms_norm_nodes(gm) == []


def test_every_failing_kind_is_named_in_the_summary():
    import edgefuse.fuzz.check as check

    kinds = {"exception", "broken-program", "dtype", "mismatch", "norm-mismatch", "wrong-norm", "near-miss-rebuilt",
             "no-reason", "fuzzer-error"}
    assert kinds <= set(FAILING) and all(kind in check.__doc__ for kind in kinds - {"fuzzer-error"})
