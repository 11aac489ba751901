"""A caller's exported program stays as it was: edgefuse's flows consume a copy of its dicts.

``to_edge`` hands the edge program the exported program's own constants dict (torch's
``run_decompositions`` passes it through when it is not empty). ExecuTorch's lowering then deletes from
that dict every constant a delegate took in, and a pass that adds a constant adds it there: the caller's
program no longer runs, or a second lowering of it fails. :func:`detached` gives a flow the same program
with dicts of its own.
"""

from __future__ import annotations

import copy

from torch.export import ExportedProgram


def detached(program: ExportedProgram) -> ExportedProgram:
    """``program`` with its own dicts of constants and state, sharing the tensors, graph and signature.

    Everything else is read, not changed, by ``to_edge`` (which traces a new graph), so nothing more is
    copied; torch offers no public way to give a program a new constants dict.
    """
    twin = copy.copy(program)
    twin._constants = dict(program.constants)
    twin._state_dict = dict(program.state_dict)
    return twin
