"""tests/harness.py finds the ops dim order changes, and fails a case run in edge alone whose graph holds one;
the modes of a case are read by tests/conftest.py's ``case_modes``."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch

from executorch.exir.passes.dim_order_ops_registry import DimOrderOpsMap

import tests.conftest
from tests.forms import LlamaNorm
from tests.harness import (DIM_ORDER_MODES, DIM_ORDER_OPS, DTYPES, _assert_dim_order_mode_kept, dim_order_ops,
                           dtype_mode_cases, exported)


def _half_norm_graph(mode: str):
    """The edge graph of a float16 Llama norm, which casts to float32 and back."""
    inputs = (torch.randn(2, 16, dtype=torch.float16),)
    return exported(LlamaNorm().to(torch.float16), inputs, mode).graph_module


@pytest.fixture(scope="module")
def half_norm_edge_graph():
    """:func:`_half_norm_graph` in ``edge``, made once for the tests that read it and change nothing in it."""
    return _half_norm_graph("edge")


class _NormInCond(torch.nn.Module):
    """A float16 Llama norm in one branch of ``torch.cond``: its casts sit in a subgraph."""

    def __init__(self):
        super().__init__()
        self.norm = LlamaNorm().to(torch.float16)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.norm(x), lambda x: x.clone(), (x,))


def test_dim_order_ops_names_the_cast_as_each_edge_mode_writes_it(half_norm_edge_graph):
    assert "_to_dim_order_copy" in dim_order_ops(half_norm_edge_graph)
    assert "_to_copy" in dim_order_ops(_half_norm_graph("edge-no-dim-order"))


def test_dim_order_ops_reads_the_branches_of_cond():
    graph = exported(_NormInCond(), (torch.randn(2, 16, dtype=torch.float16),), "edge").graph_module
    top = {getattr(n.target, "_opname", None) for n in graph.graph.nodes if n.op == "call_function"}
    assert "_to_dim_order_copy" not in top
    assert "_to_dim_order_copy" in dim_order_ops(graph)


def test_dim_order_ops_are_those_executorch_rewrites():
    """ExecuTorch's map from each op to its dim-order form (what ``to_edge`` rewrites when it keeps dim order)."""
    assert DIM_ORDER_OPS == {op._opname for pair in DimOrderOpsMap.items() for op in pair}


def test_a_case_run_in_edge_alone_fails_on_a_graph_with_a_cast(monkeypatch, half_norm_edge_graph):
    monkeypatch.setattr(tests.conftest, "case_modes", lambda: {"capture", "edge"})
    with pytest.raises(AssertionError, match="DIM_ORDER_MODES"):
        _assert_dim_order_mode_kept(half_norm_edge_graph)


def test_a_case_run_also_without_dim_order_passes_on_a_graph_with_a_cast(monkeypatch, half_norm_edge_graph):
    monkeypatch.setattr(tests.conftest, "case_modes", lambda: {"capture", "edge", "edge-no-dim-order"})
    _assert_dim_order_mode_kept(half_norm_edge_graph)


def _collected_alone(monkeypatch, item: pytest.Item) -> None:
    """Record ``item`` as the only item collected, as a run of it by its node id does."""
    monkeypatch.setattr(tests.conftest, "_MODES_OF_CASE", collections.defaultdict(set))
    tests.conftest.pytest_itemcollected(item)


@pytest.mark.parametrize("mode", ("capture", pytest.param("edge", id="edge-as-param")))
def test_a_case_runs_in_the_modes_its_mode_marker_lists_whichever_are_collected(monkeypatch, request, mode):
    _collected_alone(monkeypatch, request.node)
    assert tests.conftest.case_modes() == {"capture", "edge"}


@pytest.mark.parametrize(("other", "mode"), [(1, "capture"), (1, "edge")])
def test_a_case_with_mode_among_other_parameters_runs_in_the_modes_collected(monkeypatch, request, other, mode):
    _collected_alone(monkeypatch, request.node)
    assert tests.conftest.case_modes() == {mode}


def test_the_dtype_cases_leave_out_float32_without_dim_order_alone():
    cases = {tuple(case.values) for case in dtype_mode_cases()}
    assert cases == set(itertools.product(DTYPES, DIM_ORDER_MODES)) - {(torch.float32, "edge-no-dim-order")}
