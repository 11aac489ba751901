"""Keep an ExportedProgram's signature in step with a graph rewritten in place."""

from __future__ import annotations

from torch.export import ExportedProgram

from executorch.exir._program_utils import _get_updated_graph_signature


def sync_signature(program: ExportedProgram) -> None:
    """Rename the signature's inputs and outputs after the nodes that now stand in their places.

    A rewrite that replaces a graph output (a rebuilt norm at the end of a model, a removed cast) changes
    the output node's name, and ExecuTorch's verifier checks the signature against the graph.
    """
    program._graph_signature = _get_updated_graph_signature(program.graph_signature, program.graph_module)
