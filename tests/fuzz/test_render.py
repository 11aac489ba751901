"""The renderer writes each registry form, spelling and square as the registry does, and the matcher labels
what it writes as the registry says."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edgefuse.core import forms as registry
from edgefuse.fuzz.generate import instance
from edgefuse.fuzz.render import norm_module
from edgefuse.fuzz.spec import INVERSES, SQUARES
from tests.harness import rewrite


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

