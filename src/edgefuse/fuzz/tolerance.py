"""The tolerances of the property check, each derived from a dtype the graph computes in.

A rebuilt norm may round once where the decomposed one rounded twice: about one unit in the last place
(ulp) of the norm's dtype D, so the check allows ``ULPS`` = 2 ulps of D at the largest magnitude
(:func:`edgefuse.verify.tolerance`). At a graph output, that difference may have passed through an op
that rounds to a coarser dtype, where it can flip one rounding: the output's tolerance is then in the
coarsest dtype on any path from a rebuilt norm to it (:func:`output_tolerance_dtypes`). Nothing here is
widened to make a case pass.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.utils import _pytree as pytree

from edgefuse.verify import Comparison, compare

ULPS = 2.0
FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _ulp(dtype: torch.dtype | None) -> float:
    return torch.finfo(dtype).eps if dtype is not None and dtype.is_floating_point else 0.0


def _coarsest(ulp: float) -> torch.dtype:
    """The float dtype whose unit in the last place is ``ulp`` (the finest one at least that coarse)."""
    for dtype in reversed(FLOATS):
        if torch.finfo(dtype).eps <= ulp:
            return dtype
    return torch.bfloat16


def output_tolerance_dtypes(
    graph_module: GraphModule, new_nodes: set[str], known: dict[str, torch.dtype] | None = None
) -> list[torch.dtype | None]:
    """For each graph output, the coarsest dtype on any path from a rebuilt node to it (None: no path).

    ``known`` gives dtypes by node name for nodes whose metadata is missing (hostile graphs).
    """
    known = known or {}
    worst: dict[Node, float] = {}
    for node in graph_module.graph.nodes:
        value = node.meta.get("val")
        own = _ulp(value.dtype) if isinstance(value, torch.Tensor) else _ulp(known.get(node.name))
        reached = [worst[n] for n in node.all_input_nodes if n in worst]
        if node.op != "output" and (reached or node.name in new_nodes):
            worst[node] = max([own, *reached])
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    return [
        _coarsest(worst[arg]) if isinstance(arg, Node) and arg in worst else None
        for arg in pytree.tree_leaves(list(results))
    ]


def compare_at(expected: torch.Tensor, actual: torch.Tensor, dtype: torch.dtype | None, ulps: float = ULPS) -> Comparison:
    """:func:`edgefuse.verify.compare` at ``ulps`` units of ``dtype`` (the expected tensor's dtype if None).

    NaN and inf must sit at the same places in both (an infinite error otherwise); the finite values
    agree within ``ulps`` units in the last place of ``dtype`` at the largest finite expected magnitude.
    """
    if dtype is not None and not dtype.is_floating_point:
        dtype = None
    return compare(expected, actual, ulps, dtype)


def eps_roundings(eps: float | None) -> set[float]:
    """The eps values a rebuilt norm may carry for a model that adds ``eps`` (None: no addition).

    A constant eps tensor holds eps rounded to its dtype, and an eps that rounds to zero in the dtype
    the model adds it in adds nothing: so eps itself, and eps rounded to each float dtype.
    """
    value = 0.0 if eps is None else eps
    return {value, *(float(torch.tensor(value, dtype=d)) for d in FLOATS)}
