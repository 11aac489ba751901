"""The edge programs the fuzzer checks: its cached op list does not change the edge graph, and lists an op
registered while it is cached."""

from __future__ import annotations

from torch.export import export

from edgefuse.fuzz.generate import generate
from edgefuse.fuzz.edge_programs import cached_cia_ops, to_edge_program
from edgefuse.fuzz.render import build
from tests.fuzz.cases import SEED


def test_the_cached_op_list_does_not_change_the_edge_graph(monkeypatch):
    import torch._export.utils as export_utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    built = build([generate(SEED, 0)])
    program = export(built.module, built.inputs)
    for module in (exported_program, decomp_utils):  # torch's own list, whatever the test session caches
        monkeypatch.setattr(module, "_collect_all_valid_cia_ops", export_utils._collect_all_valid_cia_ops)
    plain = to_edge_program(program, "edge")
    with cached_cia_ops():
        first = to_edge_program(program, "edge")  # fills the cache
        second = to_edge_program(program, "edge")  # reads it
    assert first.graph_module.code == plain.graph_module.code and second.graph_module.code == plain.graph_module.code


def test_an_op_registered_while_the_list_is_cached_is_listed_as_torch_lists_it():
    """The cache is keyed by the registered ops: a CompositeImplicitAutograd op defined inside the block
    (as a library an import loads) is in the list read after it, as in torch's own."""
    import torch
    import torch.export.exported_program as exported_program

    name = "edgefuse_cia_test.twice.default"
    library = torch.library.Library("edgefuse_cia_test", "DEF")
    try:
        with cached_cia_ops():
            before = {str(op) for op in exported_program._collect_all_valid_cia_ops()}
            library.define("twice(Tensor x) -> Tensor")
            library.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
            after = {str(op) for op in exported_program._collect_all_valid_cia_ops()}
    finally:
        library._destroy()
    assert name not in before and name in after


def test_a_kernel_added_to_an_op_while_the_list_is_cached_is_listed_as_torch_lists_it():
    """The cache is keyed by the ops with a CompositeImplicitAutograd kernel too: an op defined with another
    kernel, then given one, adds no op name, and is in the list read after it, as in torch's own."""
    import torch
    import torch.export.exported_program as exported_program

    name = "edgefuse_cia_test.thrice.default"
    library = torch.library.Library("edgefuse_cia_test", "DEF")
    try:
        with cached_cia_ops():
            library.define("thrice(Tensor x) -> Tensor")
            library.impl("thrice", lambda x: x * 3, "CompositeExplicitAutograd")
            before = {str(op) for op in exported_program._collect_all_valid_cia_ops()}
            library.impl("thrice", lambda x: x * 3, "CompositeImplicitAutograd")
            after = {str(op) for op in exported_program._collect_all_valid_cia_ops()}
    finally:
        library._destroy()
    assert name not in before and name in after
