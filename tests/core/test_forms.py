"""Every form of RMSNorm is rebuilt on the right tensor in every dtype and mode, and matches eager."""

from __future__ import annotations

import itertools

import pytest
import torch

from edgefuse.core import forms as registry
from edgefuse.core._fx import dtype_name
from edgefuse.fuzz.generate import instance
from edgefuse.fuzz.render import norm_module
from edgefuse.core.ops import Role, table_for
from edgefuse.core.verify import compare_elementwise
from tests.forms import WRITTEN, FunctionalNorm, LlamaNorm
from tests.harness import DTYPES, DIM_ORDER_MODES, cast_path, dtype_mode_cases, norm_input, rewrite, rms_norm_nodes

#: Every form of the registry (edgefuse.core.forms.FORMS) that captured graphs hold decomposed:
#: ``F.rms_norm`` stays one node there, and edge graphs decompose it (its own test below).
FORMS = [name for name, form in registry.FORMS.items() if not form.functional]
SHAPE = (4096, 4, 16)


def build(form: str, dtype: torch.dtype) -> torch.nn.Module:
    """The hand-written module of ``form`` (tests/forms.py) if there is one, else the registry's form
    written out by the fuzzer's renderer, its weight in ``dtype``."""
    if form in WRITTEN:
        return WRITTEN[form]().to(dtype)
    return norm_module(instance(form, dtype_name(dtype)), SHAPE)


#: How far, per element, a rebuilt norm may lie from eager, in units of D's epsilon times the element
#: (``compare_elementwise``'s unit: one unit is two unit roundoffs u of D). The model's roundings and
#: rms_norm's add up; the mean of squares and eps are computed alike in both (0 units apart in float32
#: for the rsqrt forms), so only the roundings after them count:
#: - the model computes the norm in rms_norm's precision and rounds to D after normalizing and after
#:   the weight (Llama, T5, OLMo2, Gemma, Gemma 3n's ``pow(m, -0.5)``, an rsqrt rounded alike, no weight;
#:   and float32 rsqrt forms): 2u against rms_norm's one rounding u, 1.5 units;
#: - the model divides by a sqrt (or by ``m ** 0.5``, the same root), or computes every step in a half
#:   D: in float32 its sqrt, division (or reciprocal and product) and weight round (3u, or 4u) where
#:   rms_norm's rsqrt (1.5u, measured), product and weight do (3.5u): 7.5u at most; in a half D its
#:   square, mean and eps roundings reach the root halved (1.5u), then the root, division (or reciprocal
#:   and product) and weight round (3u, or 4u) where rms_norm rounds once (u): 6.5u at most. 8u is 4
#:   units (to first order in u).
ONE_ROUNDING_MORE, OWN_ORDER = 1.5, 4.0


def allowed_units(form: str, dtype: torch.dtype) -> float:
    entry = registry.FORMS[form]
    sqrt_form = entry.root.applied != "mul"  # divides by the root, or multiplies by its reciprocal
    computed_in_half = dtype != torch.float32 and (sqrt_form or entry.computes_in_input_dtype)
    return OWN_ORDER if sqrt_form or computed_in_half else ONE_ROUNDING_MORE


def _inputs(dtype, shape=SHAPE):
    """Many rows (262144 values at the default shape), so that the rarer worst roundings occur."""
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(0)).mul(3).to(dtype),)


def assert_matches_eager(module, inputs, rewritten, units=ONE_ROUNDING_MORE):
    """The rewritten program's output has eager's dtype and each element lies within ``units``."""
    expected = module(*inputs)
    actual = rewritten.run(*inputs)
    comparison = compare_elementwise(expected, actual, units)
    assert comparison.dtype_ok, (expected.dtype, actual.dtype)
    assert comparison.ok, f"max error {comparison.max_error} > {comparison.allowed} ({expected.dtype})"


#: Each (form, dtype) rebuilt in one mode, the mode moving on by one with the form and with the dtype (a
#: Latin square): every (form, mode) and every (dtype, mode) pair is still rebuilt, in a third of the
#: full product's cases.
SQUARE = [(form, dtype, DIM_ORDER_MODES[(i + j) % len(DIM_ORDER_MODES)]) for i, form in enumerate(FORMS) for j, dtype in enumerate(DTYPES)]
#: A float32 graph holds no cast, so no op dim order changes: a form the square runs without dim order
#: in float32 alone also runs so in the half dtype it runs in ``edge``, on a graph that holds a cast.
CASES = SQUARE + [(form, dtype, "edge-no-dim-order") for form, dtype, mode in SQUARE
                  if mode == "edge" and (form, torch.float32, "edge-no-dim-order") in SQUARE]


def test_the_form_cases_cover_every_form_and_dtype_in_every_mode():
    """The covering design above leaves no form of the registry, and no dtype, untested in any mode, and runs
    every form without dim order on a graph that holds a cast (a half dtype)."""
    assert {(form, dtype) for form, dtype, _ in CASES} == set(itertools.product(FORMS, DTYPES))
    assert {(form, mode) for form, _, mode in CASES} == set(itertools.product(FORMS, DIM_ORDER_MODES))
    assert {(dtype, mode) for _, dtype, mode in CASES} == set(itertools.product(DTYPES, DIM_ORDER_MODES))
    assert {form for form, dtype, mode in CASES if mode == "edge-no-dim-order" and dtype != torch.float32} == set(FORMS)


@pytest.mark.dim_order_case("form")  # each form runs in both edge modes, without dim order in a half dtype
@pytest.mark.parametrize(("form", "dtype", "mode"), [pytest.param(*case, id="-".join(map(str, case))) for case in CASES])
def test_every_form_is_rebuilt_on_its_input(form, dtype, mode):
    entry = registry.FORMS[form]
    module = build(form, dtype)
    inputs = _inputs(dtype)
    rewritten = rewrite(module, inputs, mode)
    [decision] = rewritten.result.decisions
    assert decision.rebuilt, decision.reason
    assert decision.form == entry.label
    [node] = rms_norm_nodes(rewritten.graph_module)
    if entry.groups > 1:
        # rule 8: rebuilt over one group, on the split tensor, in the dtype the model computes in
        assert table_for(node.graph).is_a(node.args[0], Role.RESHAPE) and node.args[1] == [16 // entry.groups]
    else:
        # The new node reads the model's input itself, in the model's dtype: no cast before it.
        assert cast_path(norm_input(node)) == ("x", ())
        assert node.args[1] == [16]
        assert node.meta["val"].dtype == dtype
    # eps as the graph adds it: a Python float, a float32 constant, or one cast to the norm's dtype.
    assert node.args[3] in {float(torch.tensor(1e-6, dtype=d)) for d in (torch.float64, torch.float32, dtype)}
    has_weight = entry.weight is not None and entry.groups == 1  # a grouped norm's weight follows the merge
    assert (node.args[2] is not None) == has_weight
    assert_matches_eager(module, inputs, rewritten, allowed_units(form, dtype))


def test_the_form_tests_cover_every_root_the_matcher_labels():
    """The matcher labels a norm by its root (edgefuse.core.forms.ROOTS), grouped or not, with a weight or not:
    each of those is a form this file rebuilds, so a root the matcher accepts is never untested."""
    tested = [registry.FORMS[name] for name in FORMS]
    missing = {root.label for root in registry.ROOTS} - {form.root.label for form in tested}
    assert not missing, f"the matcher labels {sorted(missing)}, which no form test builds"
    assert any(form.groups > 1 for form in tested) and any(form.weight is None for form in tested)


@pytest.mark.parametrize(("dtype", "mode"), dtype_mode_cases(modes=("edge", "edge-no-dim-order")))
def test_functional_rms_norm_decomposed_by_edge_is_rebuilt(dtype, mode):
    module = FunctionalNorm().to(dtype)
    inputs = _inputs(dtype)
    rewritten = rewrite(module, inputs, mode)
    assert [d.rebuilt for d in rewritten.result.decisions] == [True]
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ())
    assert_matches_eager(module, inputs, rewritten)


@pytest.mark.parametrize("mode", DIM_ORDER_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qk_norm_on_four_dims_is_rebuilt_over_the_head_dim(dtype, mode):
    module = LlamaNorm().to(dtype)
    inputs = _inputs(dtype, (1024, 3, 4, 16))
    rewritten = rewrite(module, inputs, mode)
    [node] = rms_norm_nodes(rewritten.graph_module)
    assert cast_path(norm_input(node)) == ("x", ()) and node.args[1] == [16]
    assert_matches_eager(module, inputs, rewritten)
