"""Export a module in each mode, rewrite it, and describe what the rebuilt nodes read."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch.export import export
from torch.fx import GraphModule, Node

from executorch.exir import to_edge

import edgefuse
from edgefuse.core.casts import cast_source, dtype_of, is_noop_cast
from edgefuse.core.ops import Role, table_for

#: capture: ``ExportedProgram.module()``; edge: ``to_edge`` with dim order; edge-no-dim-order: ``_to_copy``.
#: A case runs in :data:`MODES`; one whose edge graph holds an op that dim order changes runs in
#: :data:`DIM_ORDER_MODES`: :func:`exported` fails a case parametrized by ``mode`` that holds one and is
#: collected in ``edge`` without ``edge-no-dim-order``.
MODES = ("capture", "edge")
DIM_ORDER_MODES = (*MODES, "edge-no-dim-order")
#: The ops ``to_edge`` writes in another form when it keeps dim order (ExecuTorch's ``MemoryFormatOpsPass``),
#: each named as it is in one mode and in the other: in a graph without them the two edge modes are one graph.
DIM_ORDER_OPS = frozenset({"_to_copy", "clone", "empty", "_to_dim_order_copy", "_clone_dim_order", "_empty_dim_order"})
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def dtype_mode_cases(dtypes=DTYPES, modes=DIM_ORDER_MODES) -> list:
    """``(dtype, mode)`` parameters: each dtype in ``modes``, float32 without ``edge-no-dim-order``. A float32
    graph holds no cast, so no op dim order changes, and its two edge graphs are one: :func:`exported` fails
    a float32 case whose edge graph holds one."""
    return [pytest.param(dtype, mode, id=f"{dtype}-{mode}") for dtype in dtypes for mode in modes
            if not (dtype == torch.float32 and mode == "edge-no-dim-order")]


@dataclass
class Rewritten:
    result: edgefuse.RecomposeResult
    graph_module: GraphModule
    run: Callable
    module: torch.nn.Module
    inputs: tuple


def exported(module: torch.nn.Module, inputs: tuple, mode: str, dynamic_shapes=None):
    """The graph (capture) or ExportedProgram (edge modes) of ``module`` in ``mode``."""
    program = export(module, inputs, dynamic_shapes=dynamic_shapes)
    if mode == "capture":
        return program.module()
    config = edgefuse.edge_compile_config(_skip_dim_order=mode == "edge-no-dim-order")
    edge = to_edge(program, compile_config=config).exported_program()
    if mode == "edge":
        _assert_dim_order_mode_kept(edge.graph_module)
    return edge


def dim_order_ops(gm: GraphModule) -> set[str]:
    """The ops of :data:`DIM_ORDER_OPS` in ``gm`` and its subgraphs, by name."""
    graphs = [module.graph for module in gm.modules() if isinstance(module, GraphModule)]
    names = {getattr(n.target, "_opname", None) for graph in graphs for n in graph.nodes if n.op == "call_function"}
    return names & DIM_ORDER_OPS


def _assert_dim_order_mode_kept(gm: GraphModule) -> None:
    """Fail the running test's case when its edge graph holds an op that dim order changes and the case is
    not also run in ``edge-no-dim-order``: leaving that mode out is sound only for graphs without them."""
    from tests.conftest import case_modes

    modes = case_modes()
    ops = dim_order_ops(gm)
    if modes is not None and ops and "edge-no-dim-order" not in modes:
        raise AssertionError(f"the edge graph holds {sorted(ops)}, which dim order changes: run this case in "
                             f"tests.harness.DIM_ORDER_MODES, not in edge alone")


def rewrite(module, inputs, mode, backend="aten", quantization_capture=False, dynamic_shapes=None) -> Rewritten:
    """Export ``module`` in ``mode`` and recompose its norms for ``backend``; keeps a copy of the module as it was."""
    original = copy.deepcopy(module)  # export may touch the module's state; eager runs from the same start
    target = exported(module, inputs, mode, dynamic_shapes)
    result = edgefuse.recompose_rms_norm(target, backend=backend, quantization_capture=quantization_capture)
    run = target if mode == "capture" else target.module()
    return Rewritten(result, result.graph_module, run, original, inputs)


def rms_norm_nodes(gm: GraphModule) -> list[Node]:
    table = table_for(gm.graph)
    return [n for n in gm.graph.nodes if table.is_a(n, Role.RMS_NORM)]


def norm_input(node: Node) -> Node:
    """The tensor an ``rms_norm`` node normalizes: its input, or, when the rebuild viewed that input as
    ``[1, rows, D]`` for a backend's shape limit, the tensor viewed."""
    source = node.args[0]
    table = table_for(node.graph)
    if table.is_a(source, Role.RESHAPE) and list(source.args[1])[:1] == [1] and len(source.args[1]) == 3:
        return source.args[0]
    return source


def cast_path(node: Node) -> tuple[str, tuple[torch.dtype, ...]]:
    """The graph input a tensor comes from and the dtypes of the value-changing casts on the way.

    ``("x", ())`` is the input itself; ``("x", (float16, float32))`` is ``x`` rounded to float16, then
    upcast to float32. Casts that change nothing are skipped.
    """
    table = table_for(node.graph)
    dtypes = []
    while node.op != "placeholder":
        source = cast_source(node, table)
        if source is None:
            return node.name, tuple(reversed(dtypes))
        if not is_noop_cast(node, table):
            dtypes.append(dtype_of(node))
        node = source
    return node.name, tuple(reversed(dtypes))


def norm_perturbation(x: torch.Tensor, w: torch.Tensor, dx, eps: float = 1e-6) -> torch.Tensor:
    """First-order bound on how much ``w * x / rms(x)`` moves, per element, when each ``x_j`` moves by at
    most ``dx_j`` (a tensor or a number): ``|w_i| (dx_i / r + |x_i| sum_j |x_j| dx_j / (D r^3))`` with
    ``r = sqrt(mean(x^2) + eps)``."""
    x, w = x.double(), w.double()
    dx = dx.double() if isinstance(dx, torch.Tensor) else torch.full_like(x, float(dx))
    r = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w.abs() * (dx / r + x.abs() * (x.abs() * dx).sum(-1, keepdim=True) / (x.shape[-1] * r**3))


def side_by_side_counts(out: str) -> dict[str, tuple[int, int]]:
    """The rows of ``edgefuse export-llm --compare``'s table in its stdout ``out``: each operator left outside
    the delegate with its count in the stock program and in edgefuse's."""
    lines = out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("stock ("))
    rows = [line.split() for line in lines[lines.index(header) + 1 :] if line.strip() and not line.startswith("wrote")]
    return {row[0]: (int(row[-2]), int(row[-1])) for row in rows}


class NormAndLinear(torch.nn.Module):
    """An RMSNorm and the Linear after it: both delegated, the Linear's weight a constant the delegate takes in."""

    def __init__(self, width: int = 64, out: int = 512):
        super().__init__()
        self.norm = torch.nn.RMSNorm(width)
        self.linear = torch.nn.Linear(width, out)

    def forward(self, x):
        return self.linear(self.norm(x))


def tensors_left_to_the_collector(lowering) -> list[torch.Tensor]:
    """The tensors that ``lowering(exported_program)`` of :class:`NormAndLinear` leaves in reference cycles
    no one can reach: the cycle collector is off while it runs, as it is whenever its thresholds are not
    reached, and what it would free is then read with ``gc.DEBUG_SAVEALL``; the collector's state is put
    back as it was."""
    import gc

    program = export(NormAndLinear().eval(), (torch.randn(2, 64),))
    enabled, debug = gc.isenabled(), gc.get_debug()
    gc.collect()
    gc.garbage.clear()
    gc.disable()
    try:
        lowering(program)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return [o for o in gc.garbage if type(o) in (torch.Tensor, torch.nn.Parameter)]
    finally:
        gc.set_debug(debug)
        gc.garbage.clear()
        if enabled:
            gc.enable()
