"""Write a program lowered for QNN to a ``.pte`` and run it on QNN's x86 HTP emulator.

A QNN program runs in the released ``executorch.runtime`` (its bindings register ``QnnBackend``) once
the QNN libraries are loaded (:func:`edgefuse.qnn.sdk.ensure_in_process`); on an x86 machine the HTP
library runs the compiled graph on its emulator. Two settings differ from a CPU program: the memory
planner must allocate the graph's inputs and outputs (the QNN delegate reads and writes them in
place), and segments are aligned as QNN's context binaries require.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

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


def run_on_emulator(
    pte: bytes, inputs: Sequence[Any], sdk: Sdk | None = None, method: str = "forward"
) -> list[torch.Tensor]:
    """The tensor outputs of one run of ``method`` of ``pte`` on the HTP emulator (the libraries of
    ``sdk``, default the one :func:`edgefuse.qnn.sdk.find` names); a failed load or run raises
    ``RuntimeError`` with what the runtime logged, a method the program lacks
    :class:`edgefuse.runtime.MethodMissing` naming the ones it has.

    Each tensor input is passed contiguous: the runtime copies an input's bytes as they lie in memory and
    QNN's delegate reads them in the contiguous order whatever dim order the program records, so a
    permuted input (T5's position bias is one) would be read scrambled and give wrong results silently.
    """
    from torch.utils import _pytree as pytree

    from edgefuse.runtime import LoadedProgram

    ensure_in_process(sdk)
    program = LoadedProgram(pte, method)
    return program.run(pytree.tree_map_only(torch.Tensor, torch.Tensor.contiguous, list(inputs)))


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
    the dequantized values at their magnitude. Returns a :class:`edgefuse.core.verify.Comparison`."""
    from edgefuse.core.verify import Comparison, max_error, tolerance

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
    """The roundings one output of a converted (fake-quantized) graph depends on, on given inputs, and the
    output steps they may move it by.

    ``count`` is the number of quantize ops on the longest path from an input to the output that round
    the value they get (a quantize whose input already lies on its grid, after a reshape or a transpose
    of values quantized alike, rounds nothing); ``coarsest`` the largest step among all the rounding
    quantize ops the output depends on, and ``coarsest_op`` the op whose output that quantize rounds.
    ``carried`` is how far, in steps of the output, the module itself moves the output when every
    rounding lands one level off (:func:`roundings`); ``steps`` the number of output steps allowed.
    """

    count: int
    coarsest: float
    coarsest_op: str
    carried: float = 0.0
    coarsest_steps: float = 0.0  # ``coarsest`` in steps of the output
    coarsest_carried: float = 0.0  # output steps one level of the coarsest rounding alone moves it by

    @property
    def steps(self) -> float:
        """One output step per rounding on the longest path, or what the module carries to the output
        when each rounding lands one level off, whichever is more.

        The count holds where the ops after a rounding carry its level at a gain of about one output step;
        a norm does not: it divides by the rms of its row, so a level of its input becomes ``w / rms``
        times that level at its output, and its output's range (hence its step) is set by the row whose
        ``|x| / rms`` is largest. Measured on QNN 2.51's emulator, SM8650, 16a8w: a QNN ``RmsNorm`` alone,
        as ExecuTorch's builder builds it (a zero beta), lands within one step of the fake-quantized module
        (a mean of -0.5 steps: its integer kernel rounds down); as edgefuse's builder builds it (a half-step
        beta: :mod:`edgefuse.qnn.visitors`), within 0.51 steps, a mean of about 0 (docs/qnn-16a4w.md, "One
        norm"); and Linear -> ``GemmaRMSNorm`` (measured with the zero beta) is 3 to 4 steps off where its
        3 roundings would allow 3: the Linear's level reaches the norm's output at 1.1 to 1.7 of its steps.
        """
        return max(float(self.count), self.carried)


#: The levels each rounding quantize op is moved by to measure what the module carries to its outputs:
#: all one level up, all one level down (the HTP's kernels round one way: a consistent level adds up
#: along a path), and each element up or down at random (seeded), which no shift-invariant op (softmax)
#: can cancel.
_LEVEL_MOVES = ("up", "down", "either")


def _rounding_quantizes(converted, leaves: list) -> tuple[dict[Any, bool], list[torch.Tensor]]:
    """Which quantize ops of ``converted`` round the values they get on ``leaves`` (its flat inputs), and
    the graph's flat outputs on them."""
    from torch.utils import _pytree as pytree

    from edgefuse.core._fx import Recorder
    from edgefuse.quant.facts import is_quantize

    quantizes = [node for node in converted.graph.nodes if is_quantize(node) and node.args
                 and getattr(node.args[0], "op", None) not in ("get_attr", None)]
    recorder = Recorder(converted, record={node.args[0].name for node in quantizes},
                        keep=lambda value: value.detach().clone())
    outputs = recorder.run(*leaves)
    rounds: dict[Any, bool] = {}
    for node in quantizes:
        scale, zero_point, low, high = (float(a) for a in node.args[1:5])
        levels = recorder.values[node.args[0].name].double() / scale + zero_point
        rounds[node] = levels.numel() > 0 and bool(  # an empty tensor (a slice of nothing) has nothing to round
            (levels - levels.round()).abs().max() > _ON_GRID
            or levels.min() < low - _ON_GRID or levels.max() > high + _ON_GRID
        )
    return rounds, [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in pytree.tree_leaves(outputs)]


def _moved_outputs(converted, leaves: list, rounds: dict[Any, bool], move: str) -> list[torch.Tensor]:
    """The flat outputs of ``converted`` on ``leaves`` with the result of every quantize op that rounds
    moved by one level (``move`` of :data:`_LEVEL_MOVES`), kept within its range."""
    from torch.utils import _pytree as pytree

    generator = torch.Generator().manual_seed(0)

    class Moved(torch.fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            if rounds.get(node, False):
                low, high = int(node.args[3]), int(node.args[4])
                if move == "either":
                    shift = torch.randint(0, 2, result.shape, generator=generator, dtype=torch.int64) * 2 - 1
                else:
                    shift = 1 if move == "up" else -1
                result = (result.to(torch.int64) + shift).clamp(low, high).to(result.dtype)
            return result

    outputs = Moved(converted).run(*leaves)
    return pytree.tree_leaves(outputs)


def roundings(converted, inputs: Sequence[Any]) -> list[Roundings | None]:
    """The :class:`Roundings` of each output of ``converted`` run on ``inputs`` (None for an output no
    quantize op reaches): which quantize ops round is read from the values they get on these inputs, and
    what the module carries from them to each output by running it again with every one of them moved one
    level (:data:`_LEVEL_MOVES`), the largest change of the output in its steps. The module's buffers (a
    KV cache it writes) are put back as they were."""
    from torch.utils import _pytree as pytree

    from edgefuse.core.fresh import kept_state

    leaves = pytree.tree_leaves(tuple(inputs))
    with torch.no_grad(), kept_state(converted):
        rounds, base = _rounding_quantizes(converted, leaves)
        moved = [_moved_outputs(converted, leaves, rounds, move) for move in _LEVEL_MOVES] if any(rounds.values()) else []
    depth: dict[Any, int] = {}
    coarsest: dict[Any, tuple[float, str]] = {}
    for node in converted.graph.nodes:
        inputs_of = node.all_input_nodes
        depth[node] = max((depth[a] for a in inputs_of), default=0) + int(rounds.get(node, False))
        found = [coarsest[a] for a in inputs_of if a in coarsest]
        if rounds.get(node, False):
            source = node.args[0]
            found.append((float(node.args[1]), str(getattr(source, "target", source)), node))
        if found:
            coarsest[node] = max(found, key=lambda f: f[0])
    (output,) = [node for node in converted.graph.nodes if node.op == "output"]
    steps = output_steps(converted)
    alone: dict[Any, list[list]] = {}
    result: list[Roundings | None] = []
    for i, leaf in enumerate(pytree.tree_leaves(output.args[0])):
        if leaf not in coarsest:
            result.append(None)
            continue
        step = steps[i] if i < len(steps) else None
        size, op, quantize = coarsest[leaf]
        if quantize not in alone:
            with torch.no_grad(), kept_state(converted):
                alone[quantize] = [_moved_outputs(converted, leaves, {quantize: True}, move) for move in _LEVEL_MOVES]
        result.append(Roundings(
            depth[leaf], size, op, _largest_move(moved, base, i, step), size / step if step else math.inf,
            _largest_move(alone[quantize], base, i, step),
        ))
    return result


def _largest_move(moved: list[list], base: list, i: int, step: float | None) -> float:
    """The largest change of output ``i`` among the ``moved`` runs against ``base``, in steps of ``step``."""
    return max(
        (float((m[i].double() - base[i].double()).abs().max()) / step for m in moved
         if step and i < len(m) and i < len(base) and isinstance(m[i], torch.Tensor) and m[i].is_floating_point()),
        default=0.0,
    )


def rms_norm_roundings(converted) -> list:
    """The per-tensor quantize ops of a converted (fake-quantized) graph module that round an ``rms_norm``'s
    output: where the module rounds to the nearest level and QNN's ``RmsNorm`` built by ExecuTorch's builder
    does not
    (:func:`rounding_down`, which reads a per-tensor op's arguments: one scale, one zero point, the range
    and the dtype)."""
    from edgefuse.core.ops import Role, table_for
    from edgefuse.quant.facts import is_quantize

    table = table_for(converted.graph)
    return [node for node in converted.graph.nodes
            if is_quantize(node) and "quantize_per_tensor" in str(node.target)
            and node.args and table.is_a(node.args[0], Role.RMS_NORM)]


def rounding_down(converted, quantizes: Sequence[Any]):
    """``converted`` as a function of the inputs it is called with, where each of the quantize ops
    ``quantizes`` rounds down (to the level at or below its value) instead of to the nearest level.

    QNN's integer ``RmsNorm`` as ExecuTorch's builder builds it (a zero beta) rounds its output down:
    measured on QNN 2.51's emulator, SM8650, one norm alone lands half a step below the exact norm on
    average (-0.51 steps at 16a8w, -0.46 at 8a8w), where the module rounds to the nearest level
    (``tests/qnn/test_qnn_rounding.py``). That is the released flow's whole norms (``nn.RMSNorm``,
    ``F.rms_norm``); edgefuse's builder gives the op a half-step beta and it rounds to nearest
    (:mod:`edgefuse.qnn.visitors`). A program's distance from this module beside its distance from the
    module as converted says how much of it that rounding is. Like a call of the module, a call writes the module's buffers (a KV cache)."""
    from torch.utils import _pytree as pytree

    from edgefuse.core.mutation import schema_argument

    down = set(quantizes)
    names = ("input", "scale", "zero_point", "quant_min", "quant_max", "dtype")

    class RoundingDown(torch.fx.Interpreter):
        def run_node(self, node):
            if node not in down:
                return super().run_node(node)
            arguments = tuple(schema_argument(node, name) for name in names)
            value, scale, zero_point, low, high, dtype = self.map_nodes_to_values(arguments, node)
            return torch.clamp(torch.floor(value * (1.0 / scale)) + zero_point, low, high).to(dtype)

    def call(*inputs):
        with torch.no_grad():
            return RoundingDown(converted).run(*pytree.tree_leaves(inputs))

    return call


def output_tolerances(converted, inputs: Sequence[Any]) -> list[tuple[float, Roundings] | None]:
    """The derived tolerance of each output of a converted (fake-quantized) graph run on ``inputs``: its
    quantization step (:func:`output_steps`) and the :class:`Roundings` on its longest path
    (:func:`roundings`); a program's output is compared with the module's at ``counted.steps`` of them
    (``compare_at_steps(expected, actual, step, counted.steps)``). None for an output the quantizer left
    in float, which is compared as float16."""
    steps, counted = output_steps(converted), roundings(converted, inputs)
    return [
        (step, count) if step is not None and count is not None else None
        for step, count in zip(steps, counted)
    ]


#: The integer dtype a program takes a quantized input in, and gives a quantized output in, by the range
#: of its levels: the quantizer holds 16-bit levels in int32, the program in the 16-bit type itself.
_LEVEL_DTYPES = {(0, 255): torch.uint8, (-128, 127): torch.int8, (0, 65535): torch.uint16, (-32768, 32767): torch.int16}


def _levels_dtype(node) -> torch.dtype:
    """The integer type a program holds the levels of the quantize or dequantize op ``node`` in."""
    from edgefuse.core.mutation import schema_argument

    low, high = int(schema_argument(node, "quant_min")), int(schema_argument(node, "quant_max"))
    return _LEVEL_DTYPES.get((low, high), schema_argument(node, "dtype"))


@dataclass(frozen=True)
class QuantizedIo:
    """How a program whose inputs and outputs QNN keeps quantized (the static-Llama script tags them so)
    meets its fake-quantized module: ``inputs`` holds, per flat input of the module, the quantize op that
    reads it (None for one it reads as it is: tokens, positions), ``outputs`` per output the dequantize op
    that produces it (None for an output left in float). The program holds the levels in the integer type
    of their range (:data:`_LEVEL_DTYPES`)."""

    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]

    def program_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        """The module's flat ``inputs`` as the program takes them: each quantized by its quantize op."""
        from torch.utils import _pytree as pytree

        leaves = pytree.tree_leaves(tuple(inputs))
        return [
            value if node is None else node.target(value, *node.args[1:], **node.kwargs).to(_levels_dtype(node))
            for value, node in zip(leaves, self.inputs)
        ]

    def module_outputs(self, outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The program's ``outputs`` in the module's terms: each quantized one dequantized by its op."""
        from edgefuse.core.mutation import schema_argument

        return [
            value if node is None or value.is_floating_point()
            else node.target(value.to(schema_argument(node, "dtype")), *node.args[1:], **node.kwargs)
            for value, node in zip(outputs, self.outputs)
        ]

    def mismatches(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> list[str]:
        """Where the program (``inputs`` and ``outputs`` as its method declares them, each an
        :class:`edgefuse.runtime.TensorMeta` or None: :func:`edgefuse.runtime.method_io`) holds a quantized
        input or output in another integer type than its module's levels, or declares another count of
        inputs or outputs than its module has, one sentence each. A float declaration is what QNN gives a
        quantized output it dequantizes itself, and is no mismatch; a quantized input is fed its levels
        (:meth:`program_inputs`), which the runtime refuses for an input declared float.

        QNN's delegate reads and writes each tensor in the type of the levels it was compiled with,
        whatever the program declares, into buffers the runtime sized by the declaration: an output
        declared narrower than its levels is written past its buffer's end (a heap corruption that shows
        when the buffers are freed), and its values read back in the wrong type. Such a method is not run.
        """
        found = [f"method declares {len(declared)} {kind}s where its module has {len(nodes)}"
                 for kind, nodes, declared in (("input", self.inputs, inputs), ("output", self.outputs, outputs))
                 if len(declared) != len(nodes)]
        for kind, i, meta, levels in self._mistyped(inputs, outputs):
            fed = ", and is fed those levels, which the runtime refuses for a float input" if kind == "input" and _is_float(meta.dtype) else ""
            found.append(f"{kind} {i} is declared {meta.type_name} {list(meta.shape)} ({meta.nbytes} bytes) where "
                         f"its module's levels are {str(levels).removeprefix('torch.')} ({_levels_nbytes(meta, levels)} bytes){fed}")
        return found

    def overruns(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> bool:
        """Whether a quantized input or output is declared in fewer bytes than its levels take, so that QNN
        reads or writes past the buffer the runtime sized by the declaration (arguments as in
        :meth:`mismatches`)."""
        return any(meta.nbytes < _levels_nbytes(meta, levels) for _, _, meta, levels in self._mistyped(inputs, outputs))

    def _mistyped(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> Iterator[tuple[str, int, Any, torch.dtype]]:
        """``(kind, index, declared, levels)`` of each quantized input the program declares in another type
        than its levels', and each quantized output it declares in another integer type."""
        for kind, nodes, declared in (("input", self.inputs, inputs), ("output", self.outputs, outputs)):
            for i, (node, meta) in enumerate(zip(nodes, declared)):
                levels = None if node is None else _levels_dtype(node)
                dequantized_by_qnn = kind == "output" and meta is not None and _is_float(meta.dtype)
                if levels is not None and meta is not None and meta.dtype != levels and not dequantized_by_qnn:
                    yield kind, i, meta, levels


def _levels_nbytes(meta, levels: torch.dtype) -> int:
    """The bytes the levels of a tensor of ``meta``'s shape take."""
    return math.prod(meta.shape) * levels.itemsize


def _is_float(dtype) -> bool:
    """Whether ``dtype`` (a torch dtype, or None for a type torch lacks) is a floating type."""
    return dtype is not None and dtype.is_floating_point


def quantized_io(converted) -> QuantizedIo:
    """The :class:`QuantizedIo` of a converted (fake-quantized) graph module: a placeholder is read
    quantized when a quantize op reads it, an output is produced by the dequantize op it comes from."""
    from torch.utils import _pytree as pytree

    from edgefuse.quant.facts import is_dequantize, is_quantize

    graph = converted.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    (output,) = [node for node in graph.nodes if node.op == "output"]
    inputs = tuple(next((user for user in node.users if is_quantize(user)), None) for node in placeholders)
    outputs = tuple(leaf if is_dequantize(leaf) else None for leaf in pytree.tree_leaves(output.args[0]))
    return QuantizedIo(inputs, outputs)
