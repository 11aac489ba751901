"""Exporting generated modules the way the checks need them: edge programs, and a cache that makes it fast.

``to_edge`` is the fuzzer's largest cost (about a second per call whatever the graph's size), and a third
of it is torch.export rebuilding its list of CompositeImplicitAutograd ops from the dispatcher on every
call. :func:`cached_cia_ops` keeps that list for the duration of a run.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator

import edgefuse


@contextlib.contextmanager
def cached_cia_ops() -> Iterator[None]:
    """Cache torch.export's list of CompositeImplicitAutograd ops while the block runs, keyed by the ops
    registered (their names, not their count: one removed and another defined keep it), the ops with a
    CompositeImplicitAutograd kernel (one can be added to an op already defined) and the op namespaces
    Python has opened, so that an op or kernel registered inside the block (a library loaded by an import)
    is listed as torch lists it.

    The edge graphs are the same with and without the cache (tests/fuzz/test_edge_programs.py checks it).
    """
    import torch
    import torch._export.utils as export_utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    original = export_utils._collect_all_valid_cia_ops
    lists: dict[tuple, set] = {}

    def cached() -> set:
        key = (hash(tuple(sorted(torch._C._dispatch_get_all_op_names()))),
               tuple(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")),
               tuple(torch.ops._dir))
        if key not in lists:
            lists.clear()
            lists[key] = original()
        return lists[key]

    patched = [(m, m._collect_all_valid_cia_ops) for m in (exported_program, decomp_utils)]
    for module, _ in patched:
        module._collect_all_valid_cia_ops = cached
    try:
        yield
    finally:
        for module, value in patched:
            module._collect_all_valid_cia_ops = value


def to_edge_program(program, mode: str):
    """The edge ``ExportedProgram`` of a copy of ``program``: ``mode`` is "edge" or "edge-no-dim-order".

    The compile config is :func:`edgefuse.edge_compile_config`, whose verifier accepts a rebuilt
    ``rms_norm``, as a user of the pass would write it.
    """
    from executorch.exir import to_edge

    config = edgefuse.edge_compile_config(_skip_dim_order=mode == "edge-no-dim-order")
    return to_edge(copy.deepcopy(program), compile_config=config).exported_program()
