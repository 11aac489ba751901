"""A caller's exported program stays as it was: edgefuse's flows lower a copy with its own constants.

``to_edge`` hands the edge program the exported program's own constants dict (torch's
``run_decompositions`` passes it through when it is not empty). ExecuTorch's lowering then deletes from
that dict every constant a delegate took in, and a pass that adds a constant adds it there: the caller's
program no longer runs, or a second lowering of it fails. :func:`detached` gives a flow the same program
with a constants dict of its own.
"""

from __future__ import annotations

import copy

from torch.export import ExportedProgram


def detached(program: ExportedProgram) -> ExportedProgram:
    """``program`` with its own constants dict, sharing the tensors, graph, state dict and signature.

    The state dict needs no copy: ``run_decompositions`` builds the edge program a new one. For an
    inference program the rest is read, not changed, by ``to_edge``, which traces a new graph. The copy
    is shallow because ``ExportedProgram``'s constructor would rebuild the graph module.
    """
    twin = copy.copy(program)
    twin._constants = dict(program.constants)
    return twin
