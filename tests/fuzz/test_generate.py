"""The generator makes what it claims: every form, near miss, cast, neighbour and root, many eps values,
a third near misses, each case a pure function of seed and index, and no branch on a form's name."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

from edgefuse.core import forms as registry
from edgefuse.fuzz.generate import features, generate
from edgefuse.fuzz.render import build, source
from edgefuse.fuzz.spec import CAST_KINDS, FORMS, INVERSES, NEAR_MISSES, SQUARES, CaseSpec
from tests.fuzz.cases import RENAMED, SEED, enter_renamed, first_case


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


def _renamed(spec: CaseSpec) -> CaseSpec:
    """``spec`` with its norms' forms under their :data:`RENAMED` names."""
    def rename(norm):
        return dataclasses.replace(norm, form=RENAMED.get(norm.form, norm.form))

    return dataclasses.replace(spec, norm=rename(spec.norm), feed=spec.feed and rename(spec.feed))


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

    enter_renamed(monkeypatch)

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
    spec = first_case(lambda s: s.near_miss == "cube" and s.feed is None and not s.tails and s.norm.weight is None
                  and s.heads == 1 and not s.residual)
    built = build([spec])
    x = built.inputs[0]
    out = built.module(*built.inputs)[0]
    assert not torch.allclose(out.double(), torch.nn.functional.rms_norm(x.double(), (x.shape[-1],), eps=1e-6), atol=1e-2)

