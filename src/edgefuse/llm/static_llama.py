"""ExecuTorch 1.5.1's static-Llama QNN script (``examples/qualcomm/oss_scripts/llama/llama.py``, the script
Qualcomm's LLM users run) with edgefuse's QNN passes, and its program checked method by method.

The script is run in this process, not in a child: its work is one call, ``export_llama(args)``, and its
lowering of the decoder is one call to ``to_edge_transform_and_lower_to_qnn`` (``wrappers/llm_wrappers.py``)
with each method's converted (fake-quantized) module and example inputs. In this process
:func:`edgefuse.qnn.patched` puts edgefuse's passes in every pass list the script builds, the graphs QNN
compiles are recorded (:mod:`edgefuse.qnn.graphs`), and each method's module and inputs are kept as the
script lowered them: what the program is compared with. A checker run after the script could see none of
that (the script saves the ``.pte`` and the calibration graph's QDQ program, not the modules of its
methods). Tried so: a compile-only run of a tiny config (one layer, QK norms, head dims 32 and 64, 16a4w)
compiles in this process in two to six minutes on two cores, and its ``.pte`` runs on the x86 HTP emulator
method by method, each method in a child process (:func:`check_method`).

Two settings are the emulator's, so :func:`run_script` sets them whatever the arguments say:
``--compile_only`` (the script's inference pushes to a phone over adb) and ``--enable_x86_64`` (no
shared buffers, no weight sharing: the emulator has neither).

The script imports ``torchtune``, ``lm_eval``, ``datasets`` and ``pydot`` when it loads, for converting
Hugging Face checkpoints, task evaluation, Hugging Face data sets and graph drawings; a compile-only run
from a local ``--checkpoint`` and local ``--calib_samples`` calls none of them. Where one is not installed
:func:`absent_extras` stands in for it while the script runs, for the script's own imports alone
(:data:`IMPORTERS`): every name taken from it is a class whose use (or truth) raises :class:`ExtraMissing`
naming the package, so a run that needs one stops with that reason.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Iterator

#: The script's module, and the module whose ``to_edge_transform_and_lower_to_qnn`` lowers its methods.
SCRIPT = "executorch.examples.qualcomm.oss_scripts.llama.llama"
WRAPPERS = "executorch.examples.qualcomm.oss_scripts.llama.wrappers.llm_wrappers"
LOWERING = "to_edge_transform_and_lower_to_qnn"
#: The packages the script imports when it loads and calls only on paths a compile-only run from local
#: files does not take, with what it needs each for.
EXTRAS = {
    "torchtune": "converting Hugging Face checkpoints",
    "lm_eval": "lm-evaluation-harness tasks (--eval_tasks, --calib_tasks)",
    "datasets": "Hugging Face data sets (--calib_hf_dataset, --train_hf_dataset)",
    "pydot": "graph drawings",
}
#: The name of the folder edgefuse picks for a run's outputs when ``--artifact`` is not given.
_PREFIX = "edgefuse-qnn-llama-"


class ScriptArgumentError(ValueError):
    """The script's arguments are wrong: its own parser refused them, or they ask for a SoC ExecuTorch's
    QNN backend does not compile for; the message says which."""


class ExtraMissing(ImportError):
    """The script reached a package it needs for this run that is not installed."""


#: The modules whose imports get a stand-in: the script's own (ExecuTorch's examples) and those of the
#: Qualcomm backend it loads (its debugger draws graphs with ``pydot``). An import made anywhere else, as a
#: ``try: import pydot`` of torch's, finds the package missing, as it is.
IMPORTERS = ("executorch.examples.", "executorch.backends.qualcomm.")


class _AbsentType(type):
    """The type of a stand-in class: testing the class itself for truth raises too, so an ``if`` on a
    name taken from a missing package does not take the branch meant for the package."""

    def __bool__(cls):
        raise ExtraMissing(cls.missing)


def _absent(package: str, name: str) -> type:
    missing = (f"{name} is needed for this run of the static-Llama script: install {package} "
               f"(the script uses it for {EXTRAS[package]})")

    def absent(*args, **kwargs):
        raise ExtraMissing(missing)

    body = {"__init__": absent, "__call__": absent, "missing": missing, "__module__": package}
    return _AbsentType(name.rsplit(".", 1)[-1], (), body)


#: The import machinery's modules (the frozen bootstrap and ``importlib``), whose frames sit between an
#: import and the finder.
_MACHINERY = ("_frozen_importlib", "importlib")


def _importer() -> str:
    """The name of the module whose code is importing now: the first frame outside the import machinery
    (and outside this finder)."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_globals.get("__name__") or "").startswith(_MACHINERY):
        frame = frame.f_back
    return "" if frame is None else frame.f_globals.get("__name__") or ""


class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a module of a package of :data:`EXTRAS` that no other finder finds, as a stand-in, for an
    import made by a module of :data:`IMPORTERS`."""

    def find_spec(self, name, path=None, target=None):
        package = name.partition(".")[0]
        if package not in EXTRAS or not _importer().startswith(IMPORTERS):
            return None
        if any(_found(finder, name, path) for finder in sys.meta_path if finder is not self):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        package = spec.name.partition(".")[0]

        def attribute(name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return _absent(package, f"{spec.name}.{name}")

        module.__getattr__ = attribute
        return module

    def exec_module(self, module):
        return None


def _found(finder, name: str, path) -> bool:
    find = getattr(finder, "find_spec", None)
    try:
        return find is not None and find(name, path) is not None
    except (ImportError, ValueError):
        return False


#: The packages of :data:`EXTRAS` this process has stood in for.
STOOD_IN: set[str] = set()


@contextlib.contextmanager
def absent_extras() -> Iterator[None]:
    """Within the block, an import of a package of :data:`EXTRAS` that is not installed gets a stand-in
    (see the module's docstring), and joins :data:`STOOD_IN`. On exit the finder and the stand-ins leave
    ``sys.modules`` (the script's modules keep what they took from them)."""
    finder = _StandIn()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name, module in list(sys.modules.items()):
            if getattr(getattr(module, "__spec__", None), "loader", None) is finder:
                STOOD_IN.add(name.partition(".")[0])
                del sys.modules[name]


def _script():
    with absent_extras():
        return importlib.import_module(SCRIPT)


def parse_script_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` read by the script's own parser; its refusals raise :class:`ScriptArgumentError` instead
    of ending the process. ``--artifact`` is None when not given (:func:`run_script` then picks a folder)."""
    from edgefuse.qnn.socs import qnn_socs

    parser = _script()._build_parser()
    parser.set_defaults(artifact=None)

    def refuse(message: str):
        raise ScriptArgumentError(f"llama.py: {message}")

    parser.error = refuse
    args = parser.parse_args(argv)
    known = qnn_socs()
    if known and args.soc_model not in known:
        raise ScriptArgumentError(f"--soc_model {args.soc_model}: ExecuTorch's QNN backend compiles for "
                                  f"{', '.join(known)}")
    return args


def method_names(args: argparse.Namespace) -> list[str]:
    """The decoder methods the script makes for ``args``: one graph per name of its
    ``DECODER_GRAPH_NAMES``, the prefill left out in its ``kv`` mode."""
    from executorch.examples.qualcomm.oss_scripts.llama.decoder_constants import DECODER_GRAPH_NAMES

    return list(DECODER_GRAPH_NAMES[:1] if args.model_mode == "kv" else DECODER_GRAPH_NAMES)


@dataclass
class Method:
    """One method as the script lowered it: the module (fake-quantized, for a quantized run) and the
    example inputs it was exported with."""

    name: str
    module: Any
    inputs: tuple


@dataclass
class ScriptRun:
    """What a run of the script made: its ``artifact`` folder, the decoder's ``.pte`` bytes (as the script
    wrote them), each method as lowered, the edge program, the graphs QNN compiled for it, and the
    :class:`edgefuse.qnn.QnnPatch` of edgefuse's passes; ``stood_in`` names the packages of
    :data:`EXTRAS` the script went without."""

    args: argparse.Namespace
    artifact: str
    pte: bytes = b""
    methods: dict[str, Method] = field(default_factory=dict)
    edge: Any = None
    graphs: Any = None
    patch: Any = None
    stood_in: list[str] = field(default_factory=list)


def _capturing(original, run: ScriptRun, decoder_methods: list[str]):
    """The script's ``to_edge_transform_and_lower_to_qnn``, keeping a copy of each decoder method's module
    and inputs before lowering and the edge program and ``.pte`` bytes after it."""

    def to_edge_transform_and_lower_to_qnn(module, inputs, *args, **kwargs):
        decoder = isinstance(module, dict) and set(module) <= set(decoder_methods)
        if decoder:
            run.methods = {name: Method(name, copy.deepcopy(m), tuple(inputs[name])) for name, m in module.items()}
        edge = original(module, inputs, *args, **kwargs)
        if decoder:
            run.edge = edge
            to_executorch = edge.to_executorch

            def keeping_bytes(*a, **k):
                program = to_executorch(*a, **k)
                run.pte = bytes(program.buffer)
                return program

            edge.to_executorch = keeping_bytes
        return edge

    to_edge_transform_and_lower_to_qnn.__wrapped__ = original
    return to_edge_transform_and_lower_to_qnn


def run_script(args: argparse.Namespace) -> ScriptRun:
    """Run the script's ``export_llama`` on ``args`` (from :func:`parse_script_args`) in this process,
    compile-only for the emulator, with edgefuse's QNN passes; its outputs go to ``args.artifact``, or a
    new private folder when it is None (an ``--artifact`` another user could write raises
    :class:`edgefuse.runtime.files.UnsafeFolder`). Returns the :class:`ScriptRun`."""
    from edgefuse.qnn.graphs import qnn_graphs, recording_compiled_graphs
    from edgefuse.qnn.passes import patched
    from edgefuse.qnn.sdk import ensure_in_process
    from edgefuse.runtime.files import fresh_private_folder, own_folder

    args = copy.copy(args)
    args.compile_only, args.enable_x86_64 = True, True
    args.artifact = own_folder(args.artifact) if args.artifact else fresh_private_folder(_PREFIX)
    if args.build_folder is not None:
        args.build_folder = os.path.realpath(args.build_folder)
    run = ScriptRun(args, args.artifact)
    ensure_in_process()
    script = _script()
    wrappers = importlib.import_module(WRAPPERS)
    original = getattr(wrappers, LOWERING)
    setattr(wrappers, LOWERING, _capturing(original, run, method_names(args)))
    try:
        with absent_extras(), patched(soc=args.soc_model) as patch, recording_compiled_graphs() as compiled:
            script.export_llama(args)
    finally:
        setattr(wrappers, LOWERING, original)
    run.patch, run.stood_in = patch, sorted(STOOD_IN)
    if run.edge is not None:
        run.graphs = qnn_graphs(run.edge, compiled, patch.decisions, patch.nearest)
    return run


@dataclass
class MethodCheck:
    """One method of a :class:`ScriptRun`'s program: the norms its edge program keeps whole
    (``aten.rms_norm``, in its delegates or outside them), the ``RmsNorm`` ops QNN compiled for it, the
    decisions of edgefuse's recomposition in its to_edge pipeline and what the legalize pass did to each
    whole norm there (``legalized``, :func:`runs_by_method`), and its run on the HTP emulator against the
    module the script lowered, output by output (a quantized output at its quantization step:
    :func:`edgefuse.qnn.emulator.output_tolerances`; None where the quantizer left it in float, compared
    as float16). ``failure`` is the runtime's reason when it did not run, or why it was not run: a program
    that declares a quantized input or output in another type than its module's levels
    (:meth:`edgefuse.qnn.emulator.QuantizedIo.mismatches`)."""

    name: str
    whole_norms: int
    rms_norms: int
    decisions: list = field(default_factory=list)
    legalized: list = field(default_factory=list)
    comparisons: list = field(default_factory=list)
    tolerances: list = field(default_factory=list)
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and bool(self.comparisons) and all(c.ok for c in self.comparisons)


def _whole_norms(program) -> int:
    """How many ``rms_norm`` nodes an edge program holds, in its delegates' graphs and outside them."""
    from edgefuse.core.ops import EDGE

    graphs = [program.graph_module.graph]
    graphs += [m.original_module.graph for _, m in program.graph_module.named_children() if hasattr(m, "original_module")]
    return sum(1 for graph in graphs for node in graph.nodes if node.target is EDGE.rms_norm)


def runs_by_method(run: ScriptRun) -> dict:
    """The run of edgefuse's recomposition (with the legalize pass after it) in each method's to_edge
    pipeline, a :class:`edgefuse.qnn.PassRun`. ExecuTorch runs the to_edge passes of one method after
    another in the order the script hands them over, one recomposition each; when the runs do not pair up
    with the methods so, none is attributed (an empty dict)."""
    runs = [r for r in run.patch.runs if r.pipeline == "to_edge" and r.name == "RecomposeRmsNorm"] if run.patch else []
    if len(runs) != len(run.methods):
        return {}
    return dict(zip(run.methods, runs))


def decisions_by_method(run: ScriptRun) -> dict[str, list]:
    """The norm decisions of edgefuse's recomposition in each method's to_edge pipeline (:func:`runs_by_method`)."""
    return {name: list(r.decisions) for name, r in runs_by_method(run).items()}


def _emulator_outputs(pte: bytes, inputs: list, method: str) -> list:
    """The outputs of one run of ``method`` on the HTP emulator, run in a child process
    (:func:`edgefuse.runtime.contained.contained`): a program that aborts the runtime ends the child, and
    its reason becomes a ``RuntimeError`` here."""
    import torch

    from edgefuse.qnn.emulator import run_on_emulator
    from edgefuse.runtime.contained import contained

    def step(note):
        note(f"running {method} on the HTP emulator")
        outputs = run_on_emulator(pte, inputs, method=method)
        return [[str(t.dtype).removeprefix("torch."), list(t.shape), t.flatten().tolist()] for t in outputs]

    return [torch.tensor(values).to(getattr(torch, dtype)).reshape(shape) for dtype, shape, values in contained(step)]


def not_run(io, inputs: tuple, outputs: tuple) -> str | None:
    """Why a method whose program declares ``inputs`` and ``outputs`` (:func:`edgefuse.runtime.method_io`)
    is not run against its module's :class:`edgefuse.qnn.emulator.QuantizedIo` ``io``; None when it is.
    Past the buffers only when a declaration is smaller than the levels QNN reads or writes."""
    mistyped = io.mismatches(inputs, outputs)
    if not mistyped:
        return None
    past = ", past the buffers the runtime sizes by the declared types" if io.overruns(inputs, outputs) else ""
    return f"not run: the program's {'; '.join(mistyped)}; QNN reads and writes the levels it was compiled with{past}"


def check_method(run: ScriptRun, name: str) -> MethodCheck:
    """Run method ``name`` of ``run``'s program once on the HTP emulator on the inputs the script lowered
    it with, and compare each output with the module's; a method the program lacks raises
    :class:`edgefuse.runtime.MethodMissing` naming the ones it has."""
    import torch

    from edgefuse.core.fresh import fresh, kept_state
    from edgefuse.core.verify import TOLERANCES, compare
    from edgefuse.qnn.emulator import compare_at_steps, output_tolerances, quantized_io
    from edgefuse.runtime import method_io

    if name not in run.methods:
        from edgefuse.runtime import MethodMissing

        raise MethodMissing(name, list(run.methods))
    method = run.methods[name]
    graphs = run.graphs.methods().get(name, []) if run.graphs is not None else []
    paired = runs_by_method(run).get(name)
    check = MethodCheck(name, _whole_norms(run.edge.exported_program(name)), sum(g.rms_norms for g in graphs),
                        list(paired.decisions) if paired else [], list(paired.legalized) if paired else [])
    io = quantized_io(method.module)
    check.failure = not_run(io, *method_io(run.pte, name))
    if check.failure is not None:
        return check
    try:
        actual = io.module_outputs(_emulator_outputs(run.pte, io.program_inputs(method.inputs), name))
    except RuntimeError as error:
        check.failure = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return check
    with torch.no_grad(), kept_state(method.module):
        expected = [t for t in torch.utils._pytree.tree_leaves(fresh(method.module(*fresh(method.inputs))))]
    check.tolerances = output_tolerances(method.module, method.inputs)
    if len(actual) != len(expected):
        check.failure = f"the program gave {len(actual)} outputs, the module {len(expected)}"
        return check
    for i, (e, a) in enumerate(zip(expected, actual)):
        tolerance = check.tolerances[i] if i < len(check.tolerances) else None
        a = a.to(e.dtype) if a.is_floating_point() else a
        if tolerance is None:
            check.comparisons.append(compare(e, a, ulps=TOLERANCES["qnn float16"].ulps, dtype=torch.float16))
        else:
            step, counted = tolerance
            check.comparisons.append(compare_at_steps(e, a, step, counted.steps))
    return check
