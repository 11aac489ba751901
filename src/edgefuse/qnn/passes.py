"""edgefuse's passes in ExecuTorch's QNN pipelines, in place of the released ``RecomposeRmsNorm`` and
``RemoveRedundancy``.

ExecuTorch 1.5.1's ``QnnPassManager`` builds its passes from classes it looks up in the module
``executorch.backends.qualcomm._passes.qnn_pass_manager`` each time a pipeline starts (the annotation
pipeline of ``QnnQuantizer``, and the to_edge passes of ``to_edge_transform_and_lower_to_qnn``; its export
and preprocess pipelines run neither pass). It reads each class's ``__init__`` signature to pick the keyword
arguments it passes (``quantization_capture``, ``edge_program``, ...). :func:`patched` puts the classes
below in the stock ones' place for the length of a block, wherever a QNN module refers to them:

- :class:`QnnRecomposeRmsNorm` rebuilds norms with :func:`edgefuse.recompose_rms_norm` under the ``qnn``
  profile of the SoC's HTP generation (:func:`edgefuse.qnn.socs.qnn_profile`), then holds every
  ``rms_norm`` of the graph to that profile's limits (:func:`edgefuse.core.legalize.legalize_rms_norm`),
  so a norm the model writes whole gets the remedy a rebuilt one gets. It is an ``ExportedProgramPassBase``, so ``to_edge_transform_and_lower`` hands it the edge
  program and it can tell lifted parameters from inputs; called on a graph module (the pass manager's own
  ``transform_for_to_edge_pipeline``), it reads the ``edge_program`` it was built with when that program
  holds the graph.
- :class:`QnnRemoveRedundancy` removes what the stock pass removes, except a ``_to_copy`` that changes the
  dtype (the stock pass drops every ``_to_copy`` with a ``memory_format``, and with it a cast the model
  computes), and then the casts that change nothing (:func:`edgefuse.remove_redundant_casts`), so a norm
  written on a no-op cast is rebuilt on its source.

While the block runs, QNN's ``RmsNorm`` is built by edgefuse's builder too
(:func:`edgefuse.qnn.visitors.nearest_rms_norm`): a quantized norm's output rounds to the nearest level,
as the fake-quantized module's does, where the released builder's rounds down.

Every run's decisions land in the :class:`QnnPatch` the block yields.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import sys
import threading
from dataclasses import dataclass, field
from typing import Iterator

from torch.export import ExportedProgram
from torch.fx import GraphModule
from torch.fx.passes.infra.pass_base import PassResult

from edgefuse.core.legalize import Legalized, legalize_rms_norm
from edgefuse.core.passes import RecomposeRmsNorm, RemoveRedundantCasts
from edgefuse.core.profiles import FLOAT, QUANTIZED, BackendProfile, Precision
from edgefuse.core.recompose import Decision
from edgefuse.qnn.quantizer import QUANTIZER_MODULE, norm_precision
from edgefuse.qnn.visitors import nearest_rms_norm

#: The package whose modules refer to the stock passes, and the modules that define them.
QNN_PACKAGE = "executorch.backends.qualcomm"
_STOCK = {
    "RecomposeRmsNorm": "executorch.backends.qualcomm._passes.recompose_rms_norm",
    "RemoveRedundancy": "executorch.backends.qualcomm._passes.remove_redundancy",
}
#: The modules whose pass lists name the stock classes; imported before patching so none of them is
#: imported inside the block (and keeps the patched class after it).
_USERS = (
    "executorch.backends.qualcomm._passes",
    "executorch.backends.qualcomm._passes.qnn_pass_manager",
    "executorch.backends.qualcomm._passes.backends.htp.qnn_htp_pass_manager",
    "executorch.backends.qualcomm._passes.backends.gpu.qnn_gpu_pass_manager",
    "executorch.backends.qualcomm._passes.backends.lpai.qnn_lpai_pass_manager",
)


@dataclass(frozen=True)
class PassRun:
    """One run of an edgefuse pass inside a QNN pipeline.

    ``pipeline`` is ``"annotation"`` (a captured graph about to be quantized) or ``"to_edge"``;
    ``decisions`` are the norm decisions of a recomposition and ``legalized`` what the profile's limits
    did to each ``rms_norm`` after it; ``removed`` the nodes a cast removal removed; ``precision`` the
    precision the norms were held to (``by node`` when the quantizer sets some nodes apart).
    """

    pipeline: str
    name: str
    decisions: tuple[Decision, ...] = ()
    removed: tuple[str, ...] = ()
    legalized: tuple[Legalized, ...] = ()
    precision: str = ""


@dataclass
class QnnPatch:
    """What :func:`patched` swapped in, the profile its passes hold norms to (``note`` says which
    generation's limits it holds), every run of those passes while the block ran, and ``nearest``: the
    name of each quantized ``rms_norm`` QNN's ``RmsNorm`` was built for with a half-step beta, so that it
    rounds to the nearest level (:mod:`edgefuse.qnn.visitors`)."""

    recompose: type
    remove_redundancy: type
    profile: BackendProfile | str = "qnn"
    note: str = ""
    runs: list[PassRun] = field(default_factory=list)
    nearest: list[str] = field(default_factory=list)

    @property
    def decisions(self) -> list[Decision]:
        """The norm decisions of every recomposition run, in order."""
        return [d for run in self.runs for d in run.decisions]

    @property
    def legalized(self) -> list[Legalized]:
        """What the limits did to each ``rms_norm`` in every run, in order."""
        return [n for run in self.runs for n in run.legalized]


def _pipeline(quantization_capture: bool) -> str:
    return "annotation" if quantization_capture else "to_edge"


#: The ``QnnQuantizer`` whose annotation pipeline is running in this thread (set by :func:`patched`'s
#: wrapper of ``QnnQuantizer.transform_for_annotation``), or None.
_ANNOTATING: contextvars.ContextVar = contextvars.ContextVar("edgefuse_qnn_annotating", default=None)


def capture_precision() -> Precision:
    """The precision the quantizer whose annotation pipeline is running quantizes norms at
    (:func:`~edgefuse.qnn.quantizer.norm_precision`), or :data:`~edgefuse.core.profiles.QUANTIZED` when no
    quantizer edgefuse can read is running."""
    quantizer = _ANNOTATING.get()
    return QUANTIZED if quantizer is None else norm_precision(quantizer)


class QnnRecomposeRmsNorm(RecomposeRmsNorm):
    """edgefuse's recomposition as a QNN pass, then every ``rms_norm`` held to the profile's limits: the
    ``qnn`` profile (a subclass made by :func:`patched` holds its SoC's), and the program wherever weights
    are lifted.

    In an annotation pipeline the norms are held to the precision of the ``QnnQuantizer`` running it
    (:func:`capture_precision`; :func:`patched` lets it be known), else to ``fp16``. Its ``__init__``
    takes the keywords ``QnnPassManager`` passes by name; a subclass made by :func:`patched` records each
    run in its :class:`QnnPatch`.
    """

    patch: QnnPatch | None = None

    def __init__(self, quantization_capture: bool = False, edge_program: ExportedProgram | None = None):
        profile = self.patch.profile if self.patch is not None else "qnn"
        capture = bool(quantization_capture)
        super().__init__(backend=profile, quantization_capture=capture, precision=capture_precision() if capture else FLOAT)
        self.edge_program = edge_program
        self.legalized: list[Legalized] = []

    def _run(self, target: ExportedProgram | GraphModule) -> bool:
        program = self.edge_program
        if isinstance(target, GraphModule) and program is not None and program.graph_module is target:
            target = program  # the pass manager hands over the program's own graph: read its signature
        changed = super()._run(target)
        held = legalize_rms_norm(target, backend=self.backend, precision=self.precision)
        self.legalized = held.norms
        if self.patch is not None:
            self.patch.runs.append(PassRun(
                _pipeline(self.quantization_capture), "RecomposeRmsNorm", tuple(self.decisions),
                legalized=tuple(self.legalized), precision=self.precision if isinstance(self.precision, str) else "by node",
            ))
        return changed or bool(held.viewed)


def _stock_remove_redundancy():
    return importlib.import_module(_STOCK["RemoveRedundancy"]).RemoveRedundancy


class QnnRemoveRedundancy:
    """The stock ``RemoveRedundancy``, keeping every ``_to_copy`` that changes the dtype, then edgefuse's
    removal of the casts that change nothing; ``removed`` names what the last run removed."""

    patch: QnnPatch | None = None

    def __init__(self, quantization_capture: bool = False):
        stock = _stock_remove_redundancy()
        self.quantization_capture = bool(quantization_capture)
        self._stock = stock(quantization_capture=self.quantization_capture)
        table = self._stock.redundant_ops
        for target, condition in list(table.items()):
            if getattr(condition, "__name__", "") == "_to_copy_op_condition":
                table[target] = _keeps_dtype(condition)
        self.removed: list[str] = []

    def __call__(self, graph_module: GraphModule):
        before = {n.name for n in graph_module.graph.nodes}
        result = self._stock(graph_module)
        graph_module = result.graph_module
        casts = RemoveRedundantCasts()
        casts(graph_module)
        after = {n.name for n in graph_module.graph.nodes}
        self.removed = sorted(before - after)
        if self.patch is not None:
            self.patch.runs.append(PassRun(_pipeline(self.quantization_capture), "RemoveRedundancy", (), tuple(self.removed)))
        return PassResult(graph_module, bool(result.modified) or bool(casts.removed))


def _keeps_dtype(condition):
    """The stock condition for removing a ``_to_copy``, and also that it keeps its input's dtype."""

    def _to_copy_op_condition(node) -> bool:
        source = node.args[0] if node.args else None
        value, source_value = node.meta.get("val"), getattr(source, "meta", {}).get("val")
        same_dtype = getattr(value, "dtype", None) is not None and value.dtype == getattr(source_value, "dtype", None)
        return same_dtype and condition(node)

    return _to_copy_op_condition


_LOCK = threading.RLock()
#: The classes of each open :func:`patched` block, oldest first.
_OPEN: list[dict[str, type]] = []


def _annotating(transform_for_annotation):
    """``QnnQuantizer.transform_for_annotation`` that lets the passes it runs know its quantizer."""

    @functools.wraps(transform_for_annotation)
    def wrapper(self, model):
        token = _ANNOTATING.set(self)
        try:
            return transform_for_annotation(self, model)
        finally:
            _ANNOTATING.reset(token)

    return wrapper


def _quantizer_told(on: bool) -> None:
    """Put the wrapper of :func:`_annotating` on the released ``QnnQuantizer`` (``on``), or take it off."""
    cls = importlib.import_module(QUANTIZER_MODULE).QnnQuantizer
    current = cls.__dict__["transform_for_annotation"]
    wrapped = getattr(current, "__wrapped__", None)
    if on and wrapped is None:
        cls.transform_for_annotation = _annotating(current)
    elif not on and wrapped is not None:
        cls.transform_for_annotation = wrapped


def _referring_modules(values: dict[str, object]) -> list[tuple[object, str, object]]:
    """``(module, name, value)`` for every loaded QNN module whose ``name`` holds ``values[name]``, except
    the modules that define the stock classes (they keep them, for anyone who needs the stock pass)."""
    found = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == QNN_PACKAGE or module_name.startswith(QNN_PACKAGE + ".")):
            continue
        if module_name in _STOCK.values():
            continue
        for name, value in values.items():
            if module.__dict__.get(name) is value:
                found.append((module, name, value))
    return found


@contextlib.contextmanager
def patched(soc: str | None = None) -> Iterator[QnnPatch]:
    """Within the block, ExecuTorch's QNN pipelines run edgefuse's recomposition and cast removal.

    The norms are held to the limits measured on the HTP generation of ``soc``; with no SoC, or one of a
    generation not measured, to every limit measured on any generation (``QnnPatch.note`` says which). A
    ``QnnQuantizer`` tells the passes of its annotation pipeline the precision it quantizes at (its
    default quant config, its submodule configs or its recipe), so the limits of that precision hold.

    Every QNN module that refers to the stock ``RecomposeRmsNorm`` or ``RemoveRedundancy`` refers to
    edgefuse's while the block runs, and to the stock ones again afterwards, also when the block raises;
    so does ExecuTorch's registry of QNN op builders for ``rms_norm`` (edgefuse's builder rounds a
    quantized norm's output to nearest: :mod:`edgefuse.qnn.visitors`).
    A user's QNN script changes by one line::

        with edgefuse.qnn.patched() as patch:
            ...  # QnnQuantizer / prepare_pt2e / convert_pt2e / to_edge_transform_and_lower_to_qnn
        patch.decisions  # what edgefuse rebuilt, and why it left the rest

    A ``passes_job`` the script builds (``get_capture_program_passes()``) must be built inside the block:
    one built before it names the stock classes. Blocks may nest, and may end in any order (threads):
    each records its own runs, and when one ends QNN's modules get the classes of the newest block still
    open, or the stock ones when none is.
    """
    from edgefuse.qnn.socs import qnn_profile

    profile, note = qnn_profile(soc)
    for module in _USERS:
        importlib.import_module(module)
    with _LOCK:
        current = {name: getattr(importlib.import_module(_USERS[0]), name) for name in _STOCK}
        patch = QnnPatch(recompose=None, remove_redundancy=None, profile=profile, note=note)  # type: ignore[arg-type]
        patch.recompose = type("RecomposeRmsNorm", (QnnRecomposeRmsNorm,), {"patch": patch, "__module__": __name__})
        patch.remove_redundancy = type(
            "RemoveRedundancy", (QnnRemoveRedundancy,), {"patch": patch, "__module__": __name__}
        )
        ours = {"RecomposeRmsNorm": patch.recompose, "RemoveRedundancy": patch.remove_redundancy}
        for module, name, _ in _referring_modules(current):
            setattr(module, name, ours[name])
        _OPEN.append(ours)
        _quantizer_told(True)
    try:
        with nearest_rms_norm(patch.nearest):
            yield patch
    finally:
        with _LOCK:
            _OPEN.remove(ours)
            after = _OPEN[-1] if _OPEN else {name: getattr(importlib.import_module(m), name) for name, m in _STOCK.items()}
            # where this block's classes are in place (every module it swapped, and any QNN module imported
            # inside it), the newest open block's or the stock ones take their place; a block that ends
            # before a newer one changes nothing the newer one put in place
            for module, name, _ in _referring_modules(ours):
                setattr(module, name, after[name])
            if not _OPEN:
                _quantizer_told(False)
