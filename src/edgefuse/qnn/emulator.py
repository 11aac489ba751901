"""Write a program lowered for QNN to a ``.pte`` and run it on QNN's x86 HTP emulator.

A QNN program runs in the released ``executorch.runtime`` (its bindings register ``QnnBackend``) once
the QNN libraries are loaded (:func:`edgefuse.qnn.sdk.ensure_in_process`); on an x86 machine the HTP
library runs the compiled graph on its emulator. Two settings differ from a CPU program: the memory
planner must allocate the graph's inputs and outputs (the QNN delegate reads and writes them in
place), and segments are aligned as QNN's context binaries require.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from edgefuse.qnn.sdk import Sdk, ensure_in_process


def backend_config():
    """The ``ExecutorchBackendConfig`` QNN programs are written with."""
    from executorch.backends.qualcomm.utils.utils import get_qnn_context_binary_alignment
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    return ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=True, alloc_graph_output=True),
        segment_alignment=get_qnn_context_binary_alignment(),
    )


def to_pte(edge) -> bytes:
    """The ``.pte`` bytes of an ``EdgeProgramManager`` lowered to QNN."""
    return edge.to_executorch(backend_config()).buffer


def run_on_emulator(pte: bytes, inputs: Sequence[Any], sdk: Sdk | None = None) -> list[torch.Tensor]:
    """The tensor outputs of one run of ``pte`` on the HTP emulator (the libraries of ``sdk``, default
    the one :func:`edgefuse.qnn.sdk.find` names); a failed load or run raises ``RuntimeError`` with what
    the runtime logged.

    Each tensor input is passed contiguous: the runtime copies an input's bytes as they lie in memory and
    QNN's delegate reads them in the contiguous order whatever dim order the program records, so a
    permuted input (T5's position bias is one) would be read scrambled and give wrong results silently.
    """
    from torch.utils import _pytree as pytree

    from edgefuse.runtime import LoadedProgram

    ensure_in_process(sdk)
    return LoadedProgram(pte).run(pytree.tree_map_only(torch.Tensor, torch.Tensor.contiguous, list(inputs)))


def output_steps(converted) -> list[float | None]:
    """The quantization step of each output of a converted (fake-quantized) graph module: the scale of
    the dequantize that produces it, or None for an output no dequantize produces."""
    from torch.utils import _pytree as pytree

    from edgefuse.quant.facts import is_dequantize

    (output,) = [node for node in converted.graph.nodes if node.op == "output"]
    return [
        float(node.args[1]) if is_dequantize(node) and isinstance(node.args[1], (int, float)) else None
        for node in pytree.tree_leaves(output.args[0])
    ]


def compare_at_steps(expected: torch.Tensor, actual: torch.Tensor, step: float, steps: float):
    """Compare a quantized program's output on the emulator with the fake-quantized module's, allowing
    ``steps`` quantization steps of size ``step`` (the HTP's integer kernels may round a value to the
    neighbouring level where the fake-quantized float arithmetic did not), plus float32's rounding of
    the dequantized values at their magnitude. Returns a :class:`edgefuse.verify.Comparison`."""
    from edgefuse.verify import Comparison, max_error, tolerance

    shape_ok = actual.shape == expected.shape
    if not shape_ok:
        return Comparison(actual.dtype == expected.dtype, False, float("inf"), 0.0)
    allowed = steps * step + tolerance(torch.float32, expected)
    return Comparison(actual.dtype == expected.dtype, True, max_error(expected, actual), allowed)


#: How far (in levels) a value may sit from a level and still count as on the grid: a dequantized 16-bit
#: value held in float32 comes back within 65535 x 2^-24 (4e-3) of its level; a value an op computed lies
#: anywhere up to half a level off.
_ON_GRID = 0.05


@dataclass(frozen=True)
class Roundings:
    """The roundings one output of a converted (fake-quantized) graph depends on, on given inputs.

    ``count`` is the number of quantize ops on the longest path from an input to the output that round
    the value they get (a quantize whose input already lies on its grid, after a reshape or a transpose
    of values quantized alike, rounds nothing); ``coarsest`` the largest step among all the rounding
    quantize ops the output depends on, and ``coarsest_op`` the op whose output that quantize rounds.
    """

    count: int
    coarsest: float
    coarsest_op: str


def roundings(converted, inputs: Sequence[Any]) -> list[Roundings | None]:
    """The :class:`Roundings` of each output of ``converted`` run on ``inputs`` (None for an output no
    quantize op reaches): which quantize ops round is read from the values they get on these inputs."""
    from torch.utils import _pytree as pytree

    from edgefuse.quant.facts import is_quantize

    rounds: dict[Any, bool] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            if is_quantize(node) and node.args and getattr(node.args[0], "op", None) not in ("get_attr", None):
                value = self.env[node.args[0]]
                scale, zero_point, low, high = (float(a) for a in node.args[1:5])
                levels = value.double() / scale + zero_point
                rounds[node] = bool(
                    (levels - levels.round()).abs().max() > _ON_GRID
                    or levels.min() < low - _ON_GRID or levels.max() > high + _ON_GRID
                )
            return super().run_node(node)

    with torch.no_grad():
        Recorder(converted).run(*pytree.tree_leaves(tuple(inputs)))
    depth: dict[Any, int] = {}
    coarsest: dict[Any, tuple[float, str]] = {}
    for node in converted.graph.nodes:
        inputs_of = node.all_input_nodes
        depth[node] = max((depth[a] for a in inputs_of), default=0) + int(rounds.get(node, False))
        found = [coarsest[a] for a in inputs_of if a in coarsest]
        if rounds.get(node, False):
            source = node.args[0]
            found.append((float(node.args[1]), str(getattr(source, "target", source))))
        if found:
            coarsest[node] = max(found, key=lambda f: f[0])
    (output,) = [node for node in converted.graph.nodes if node.op == "output"]
    return [
        Roundings(depth[leaf], *coarsest[leaf]) if leaf in coarsest else None
        for leaf in pytree.tree_leaves(output.args[0])
    ]
