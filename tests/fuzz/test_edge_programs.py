"""The edge programs the fuzzer checks: its cached op list does not change the edge graph."""

from __future__ import annotations

from torch.export import export

from edgefuse.fuzz.generate import generate
from edgefuse.fuzz.edge_programs import cached_cia_ops, to_edge_program
from edgefuse.fuzz.render import build
from tests.fuzz.cases import SEED


def test_the_cached_op_list_does_not_change_the_edge_graph():
    built = build([generate(SEED, 0)])
    program = export(built.module, built.inputs)
    with cached_cia_ops():
        first = to_edge_program(program, "edge")  # fills the cache: the plain computation
        second = to_edge_program(program, "edge")  # reads it
    assert second.graph_module.code == first.graph_module.code

