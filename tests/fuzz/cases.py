"""What the fuzzer's tests share: the seed they generate from, the capture checks, a hand-written Llama case,
the first generated case with a property, the kinds of a run's findings, and the registry's forms entered
under new names."""

from __future__ import annotations

import dataclasses

from edgefuse.fuzz.check import CHECKS
from edgefuse.core import forms as registry
from edgefuse.fuzz.generate import generate
from edgefuse.fuzz.spec import CastSpec, CaseSpec, NormSpec, WeightSpec

SEED = 4


CAPTURE = [c for c in CHECKS if c[0] == "capture"]


def first_case(predicate, seed=SEED, limit=3000) -> CaseSpec:
    """The first generated case of ``seed`` that satisfies ``predicate``."""
    for i in range(limit):
        spec = generate(seed, i)
        if predicate(spec):
            return spec
    raise AssertionError("the generator made no such case")


LLAMA = CaseSpec(
    seed=0, index=0, shape=(3, 16), dtype="float32",
    norm=NormSpec("llama", pre=(CastSpec("to", "float32"),), mid=(CastSpec("to", "input"),), weight=WeightSpec("float32", seed=3)),
)


def finding_kinds(results) -> set[str]:
    """The kinds of the findings in ``results``."""
    return {f.kind for r in results for f in r.findings}


#: Registry forms entered again under new names, each with the fields of the form it copies.
RENAMED = {"grouped": "split-width", "functional": "one-call", "scaleless": "unscaled"}


def enter_renamed(monkeypatch) -> None:
    """Give the registry's forms their :data:`RENAMED` names, each in its own place and with its fields."""
    from edgefuse.fuzz import spec as spec_module

    forms = {RENAMED.get(name, name): dataclasses.replace(form, name=RENAMED.get(name, name))
             for name, form in registry.FORMS.items()}
    monkeypatch.setattr(registry, "FORMS", forms)
    monkeypatch.setattr(spec_module, "FORMS", (*forms, "coreml"))

