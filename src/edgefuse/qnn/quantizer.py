"""QNN quantization capture with edgefuse: export, rebuild the norms, annotate, calibrate, convert.

The released ``QnnQuantizer`` (ExecuTorch 1.5.1) annotates a graph that holds ``aten.rms_norm`` as one op
with one quantize/dequantize pair in and one out, and it needs no Qualcomm SDK to annotate or convert.
These things about it shape this module:

- **Building it may download the SDK.** Importing
  ``executorch.backends.qualcomm.quantizer.quantizer`` touches no network. ``QnnQuantizer()`` does: it
  looks up the SDK's op info, which runs ``setup_qnn_sdk()`` unless ``QNN_SDK_ROOT`` is set; that
  downloads the LLVM 14 libc++ archive from GitHub with ``urllib.request.urlretrieve`` (no timeout),
  then the QNN SDK zip. Offline, the download fails at name resolution, the failure is logged (an ERROR
  with a traceback) and swallowed, and the quantizer falls back to no op-info checks, so nothing is
  raised; on a network that drops packets the same call can block for as long as the connection does.
  :func:`qnn_quantizer` therefore builds it with the SDK set-up left to the caller (an empty
  ``QNN_SDK_ROOT``, the released set-up's own convention for that), unless ``allow_sdk_download``.
- **Its annotation pipeline runs the released ``RecomposeRmsNorm``**, which rebuilds norms edgefuse
  leaves decomposed on purpose (it walks back past narrowing casts, so it drops roundings). The
  quantizer :func:`qnn_quantizer` builds leaves that pass out unless asked for the stock behaviour.
- **Float index arithmetic.** Models that compute indices through float ops (T5's relative position
  buckets: ``log``, ``div``, then ``.to(long)``) get those ops quantized, and the converted program
  then indexes out of range; those ops are kept in float (``float_index_arithmetic``).
- **Casts that change nothing are ops too.** A float32 model keeps ``x.to(torch.float32)`` in the
  captured graph; the quantizer gives it a pair of its own, so a norm rebuilt on it would read its input
  quantized twice, with a range observed apart. :func:`quantize_for_qnn` removes such casts first.
- **Half-precision programs in eager.** The converted program is checked in eager; for bfloat16 its
  dequantize ops need :func:`dequantize_in_float32` to compute what they mean.

Everything that needs ExecuTorch's Qualcomm package imports it lazily and raises
:class:`QnnUnavailable` with the reason when it cannot be imported.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch
from torch.fx import GraphModule, Node

from edgefuse.core.profiles import PRECISIONS, QUANTIZED, QUANTIZED_PRECISIONS, Precision
from edgefuse.quant.facts import DEQUANTIZE_CAST, NORM_KEY, NormQuantization, is_dequantize, is_quantize, mark_norms, norm_quantization

QUANTIZER_MODULE = "executorch.backends.qualcomm.quantizer.quantizer"

#: The ``QuantDtype`` names of the pinned release's quantizer, known without importing it (importing it
#: loads ExecuTorch's quantized kernels library into the process); a test holds this to the release.
QUANT_DTYPES = tuple(f"use_{name}" for name in QUANTIZED_PRECISIONS)

#: How a captured graph's norms reach the quantizer: rebuilt by edgefuse, by the released
#: ``RecomposeRmsNorm`` inside the quantizer's own pipeline, not rebuilt at all, or not rebuilt after
#: the casts that change nothing are removed (``casts``: the graph edgefuse's differs from by its
#: rebuilt norms alone, so comparing the two measures what recomposition does).
RECOMPOSE_MODES = ("edgefuse", "stock", "none", "casts")


def precision_name(quant_dtype: object) -> str:
    """edgefuse's name of a ``QuantDtype`` (the member or its name): ``use_8a8w`` is ``8a8w``; one edgefuse
    does not know is :data:`~edgefuse.core.profiles.QUANTIZED`, a precision not known."""
    name = str(getattr(quant_dtype, "name", quant_dtype)).removeprefix("use_")
    return name if name in PRECISIONS else QUANTIZED


def norm_precision(quantizer) -> Precision:
    """The precision a released ``QnnQuantizer`` quantizes a norm at, as edgefuse names it
    (:data:`~edgefuse.core.profiles.PRECISIONS`): its default quant config's, or, when a recipe or a
    submodule config list sets some nodes apart, a function that picks the config a node gets as the
    quantizer does (a recipe's strategies by priority, then its default; the first submodule predicate
    that holds, then the default config). A quantizer whose configuration edgefuse cannot read gives
    :data:`~edgefuse.core.profiles.QUANTIZED`: the precision is not known."""
    try:
        recipe = getattr(quantizer, "recipe", None)
        if recipe is not None:
            ranked = sorted(enumerate(recipe._strategies), key=lambda pair: (pair[1].priority, pair[0]), reverse=True)
            strategies, default = [s for _, s in ranked], precision_name(recipe._default_quant_dtype)

            def by_recipe(node: Node) -> str:
                return next((precision_name(s.quant_dtype) for s in strategies if s._matches(node)), default)

            return by_recipe
        if quantizer.submodule_qconfig_list:
            return lambda node: precision_name(quantizer._get_submodule_qconfig(node).quant_dtype)
        return precision_name(quantizer.default_quant_config.quant_dtype)
    except AttributeError:  # a quantizer of another release, or not a QnnQuantizer
        return QUANTIZED


class QnnUnavailable(RuntimeError):
    """ExecuTorch's Qualcomm quantizer cannot be imported here; the message says why."""


def load_quantizer_module(name: str = QUANTIZER_MODULE):
    """The module holding ``QnnQuantizer`` and ``QuantDtype``; :class:`QnnUnavailable` if it does not import."""
    try:
        return importlib.import_module(name)
    except Exception as error:  # an absent or broken backend package: say so instead of crashing
        raise QnnUnavailable(
            f"the QNN quantizer is unavailable: importing {name} failed ({type(error).__name__}: {error})"
        ) from error


def qnn_available() -> str | None:
    """None when the QNN quantizer imports, or the reason it does not (for a caller that goes on without it)."""
    try:
        load_quantizer_module()
    except QnnUnavailable as error:
        return str(error)
    return None


@contextlib.contextmanager
def sdk_setup_left_to_caller():
    """Within the block, the released SDK set-up returns at once instead of downloading the SDK.

    An empty ``QNN_SDK_ROOT`` means "the caller takes charge of the SDK" to ``setup_qnn_sdk``. The
    variable and the set-up's remembered state are restored afterwards, so a later QNN lowering in the
    same process still sets the SDK up. A ``QNN_SDK_ROOT`` the caller set is left alone.
    """
    if os.environ.get("QNN_SDK_ROOT") is not None:
        yield
        return
    try:
        from executorch.backends.qualcomm.utils import qnn_sdk_setup
    except Exception:
        qnn_sdk_setup = None
    ready = getattr(qnn_sdk_setup, "_sdk_ready", None)
    os.environ["QNN_SDK_ROOT"] = ""
    try:
        yield
    finally:
        os.environ.pop("QNN_SDK_ROOT", None)
        if qnn_sdk_setup is not None and ready is not None:
            qnn_sdk_setup._sdk_ready = ready


def index_arithmetic(graph_module: GraphModule) -> set[str]:
    """Names of the ops that compute an embedding's or an index op's indices (they must stay exact)."""
    roots: list[Node] = []
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target == torch.ops.aten.embedding.default and len(node.args) > 1 and isinstance(node.args[1], Node):
            roots.append(node.args[1])
        elif node.target == torch.ops.aten.index.Tensor and len(node.args) > 1:
            roots.extend(i for i in node.args[1] if isinstance(i, Node))
    names: set[str] = set()
    work = list(roots)
    while work:
        node = work.pop()
        if node.op != "call_function" or node.name in names:
            continue
        names.add(node.name)
        work.extend(node.all_input_nodes)
    return names


@functools.lru_cache(maxsize=None)
def _quantizer_class(name: str = QUANTIZER_MODULE):
    module = load_quantizer_module(name)
    try:
        from executorch.backends.qualcomm._passes import RecomposeRmsNorm
        from executorch.backends.qualcomm._passes.qnn_pass_manager import get_qnn_pass_manager_cls
    except Exception as error:
        raise QnnUnavailable(f"the QNN pass manager is unavailable ({type(error).__name__}: {error})") from error

    class EdgefuseQnnQuantizer(module.QnnQuantizer):
        """``QnnQuantizer`` whose pipeline may leave out the released ``RecomposeRmsNorm`` and keep index
        arithmetic in float; annotation rules, observers and validation are the released ones."""

        def __init__(self, *args, stock_recompose: bool = False, float_index_arithmetic: bool = True,
                     only_norms: bool = False, **kwargs):
            super().__init__(*args, **kwargs)
            self.stock_recompose = stock_recompose
            self.float_index_arithmetic = float_index_arithmetic
            self.only_norms = only_norms

        def transform_for_annotation(self, model: GraphModule) -> GraphModule:
            if self.stock_recompose:
                return super().transform_for_annotation(model)
            base = get_qnn_pass_manager_cls(self.backend)

            class WithoutStockRecompose(base):
                @classmethod
                def get_annotation_passes(cls):
                    return [p for p in base.get_annotation_passes() if p is not RecomposeRmsNorm]

            return WithoutStockRecompose().transform_for_annotation_pipeline(model)

        def _left_out(self, model: GraphModule) -> set[str]:
            """The names of ``model``'s nodes this quantizer leaves unannotated besides ``discard_nodes``."""
            names: set[str] = set()
            if self.float_index_arithmetic:
                names |= index_arithmetic(model)
            if self.only_norms:
                names |= {n.name for n in model.graph.nodes if n.op == "call_function" and NORM_KEY not in n.meta}
            return names

        @contextlib.contextmanager
        def _discarding(self, model: GraphModule):
            """``discard_nodes`` holds this graph's extra names while the block runs, and only then, so a
            quantizer used on several graphs skips no node of one because of another's names."""
            own = self.discard_nodes
            self.discard_nodes = set(own) | self._left_out(model)
            try:
                yield
            finally:
                self.discard_nodes = own

        def annotate(self, model: GraphModule) -> GraphModule:
            with self._discarding(model):
                return super().annotate(model)

        def validate(self, model: GraphModule) -> None:
            with self._discarding(model):
                super().validate(model)

    return module, EdgefuseQnnQuantizer


def qnn_quantizer(
    *,
    stock_recompose: bool = False,
    quant_dtype: str = "use_16a8w",
    act_observer: str = "minmax",
    float_index_arithmetic: bool = True,
    only_norms: bool = False,
    allow_sdk_download: bool = False,
    **kwargs: Any,
):
    """A released ``QnnQuantizer`` (HTP backend) set for ``quant_dtype`` with per-channel linear weights.

    ``stock_recompose`` keeps the released ``RecomposeRmsNorm`` in its annotation pipeline (the stock
    flow); by default it is left out, so only the norms edgefuse rebuilt reach the quantizer as one op.
    ``act_observer`` is ``"minmax"`` (every calibrated value stays in range, so an error on the
    calibration inputs is rounding alone) or ``"moving_average"`` (the released default). ``only_norms``
    annotates only the ops :func:`~edgefuse.quant.facts.mark_norms` tagged, so a program's error comes
    from its norms alone (a diagnostic). Other keyword arguments go to ``QnnQuantizer`` (``backend``,
    ``soc_model``, ``strict``).
    """
    module, cls = _quantizer_class()
    from torchao.quantization.pt2e import MinMaxObserver, MovingAverageMinMaxObserver

    observers = {"minmax": MinMaxObserver, "moving_average": MovingAverageMinMaxObserver}
    if act_observer not in observers:
        raise ValueError(f"unknown act_observer {act_observer!r}: choose one of {', '.join(observers)}")
    try:
        dtype = getattr(module.QuantDtype, quant_dtype)
    except AttributeError:
        names = ", ".join(d.name for d in module.QuantDtype)
        raise ValueError(f"unknown quant_dtype {quant_dtype!r}: QuantDtype has {names}") from None
    setup = contextlib.nullcontext() if allow_sdk_download else sdk_setup_left_to_caller()
    with setup:
        quantizer = cls(stock_recompose=stock_recompose, float_index_arithmetic=float_index_arithmetic,
                        only_norms=only_norms, **kwargs)
    quantizer.set_default_quant_config(dtype, is_linear_per_channel=True, act_observer=observers[act_observer])
    return quantizer


def _float_dtype(node: object) -> torch.dtype | None:
    """The float dtype a tensor had before quantization, looking back through quantize/dequantize chains."""
    for _ in range(64):
        if not isinstance(node, Node):
            return None
        if is_dequantize(node) and "out_dtype" in node.kwargs:
            return node.kwargs["out_dtype"]
        if (is_quantize(node) or is_dequantize(node)) and node.args:
            node = node.args[0]
            continue
        value = node.meta.get("val")
        return value.dtype if isinstance(value, torch.Tensor) else None
    return None


def dequantize_in_float32(graph_module: GraphModule) -> list[str]:
    """Make every dequantize of a non-float32 tensor compute in float32 and round once to that dtype.

    Two things make a converted bfloat16 program wrong in eager, and neither is the quantization's:
    ``convert_pt2e`` takes a dequantize's output dtype from the quantized node's metadata, and a
    requantize (dequantize, then quantize with other parameters, as QNN does for a matmul's second input)
    reads a dequantize that has none, so that dequantize returns float32 and a bfloat16 matmul fails
    (``expected scalar type Float but found BFloat16``); and ``quantized_decomposed.dequantize_per_tensor``
    computes ``(q.to(out_dtype) - zero_point) * scale``, which rounds a 16-bit integer to bfloat16's 8
    significant bits before the zero point is subtracted (up to 128 quantization steps off). Each such
    dequantize returns float32 here, followed by one cast to the tensor's dtype. Returns the names of
    the dequantize nodes changed.
    """
    wanted: dict[Node, torch.dtype] = {}
    for node in graph_module.graph.nodes:
        if not is_dequantize(node) or not node.args:
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None or "out_dtype" not in {a.name for a in schema.arguments}:
            continue
        dtype = node.kwargs.get("out_dtype")
        if dtype is None and is_quantize(node.args[0]) and node.args[0].args:
            dtype = _float_dtype(node.args[0].args[0])
        if dtype is not None and dtype != torch.float32:
            wanted[node] = dtype
    graph = graph_module.graph
    for node, dtype in wanted.items():
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "out_dtype"}
        with graph.inserting_after(node):
            cast = graph.call_function(torch.ops.aten._to_copy.default, (node,), {"dtype": dtype})
        cast.meta[DEQUANTIZE_CAST] = True
        node.replace_all_uses_with(cast, delete_user_cb=lambda user: user is not cast)
    if wanted:
        graph.lint()
        graph_module.recompile()
    return [n.name for n in wanted]


@dataclass
class QnnQuantized:
    """A graph quantized for QNN: the converted program, what was rebuilt, and each norm's quantization."""

    recompose: str
    converted: GraphModule
    norms: list[NormQuantization]
    decisions: list = field(default_factory=list)
    removed_casts: list[str] = field(default_factory=list)
    float32_dequantize: list[str] = field(default_factory=list)
    unannotated_ops: list[str] = field(default_factory=list)

    @property
    def one_op(self) -> int:
        """How many norms were annotated as one op."""
        return sum(1 for n in self.norms if n.how == "one op")


def capture(module: torch.nn.Module, example_inputs: Sequence[Any]) -> GraphModule:
    """``torch.export`` under ``no_grad`` and the captured graph module.

    Under ``no_grad`` a model's own ``torch.no_grad`` blocks (Hugging Face rotary embeddings) export as
    plain ops; otherwise they become ``wrap_with_set_grad_enabled`` calls, which the released QNN
    annotation pipeline cannot read.
    """
    with torch.no_grad():
        return torch.export.export(module, tuple(example_inputs)).module()


def quantize_for_qnn(
    module: torch.nn.Module | GraphModule,
    example_inputs: Sequence[Any],
    calibration: Iterable[Sequence[Any]],
    *,
    recompose: str = "edgefuse",
    quantizer=None,
    **quantizer_options: Any,
) -> QnnQuantized:
    """Capture, rebuild the norms as ``recompose`` says, annotate, calibrate and convert for QNN.

    ``module`` is an eager module (exported here) or a captured graph module (used as is, rewritten in
    place). ``recompose="edgefuse"`` removes casts that change nothing and rebuilds with
    ``edgefuse.recompose_rms_norm(backend="qnn", quantization_capture=True)`` at the quantizer's precision
    (:func:`norm_precision`, so a limit of that precision views a rebuilt norm), then annotates without
    the released ``RecomposeRmsNorm``; ``"stock"`` leaves the norms to the released pass inside the
    quantizer; ``"none"`` rebuilds nothing; ``"casts"`` removes the casts and rebuilds nothing.
    ``quantizer`` replaces the one :func:`qnn_quantizer` builds from ``quantizer_options``. The
    converted program's dequantize ops go through :func:`dequantize_in_float32`, and its norms are
    described in ``QnnQuantized.norms``.
    """
    import edgefuse
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if recompose not in RECOMPOSE_MODES:
        raise ValueError(f"unknown recompose {recompose!r}: choose one of {', '.join(RECOMPOSE_MODES)}")
    if quantizer is None:
        quantizer = qnn_quantizer(stock_recompose=recompose == "stock", **quantizer_options)
    gm = module if isinstance(module, GraphModule) else capture(module, example_inputs)
    removed, decisions = [], []
    if recompose in ("edgefuse", "casts"):
        removed = edgefuse.remove_redundant_casts(gm)
    if recompose == "edgefuse":
        mark_norms(gm)  # the decomposed windows, whose kept casts each rebuilt norm then takes
        decisions = edgefuse.recompose_rms_norm(
            gm, backend="qnn", quantization_capture=True, precision=norm_precision(quantizer)
        ).decisions
    mark_norms(gm, decisions)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # the released quantizer prints one line per op it skips
        prepared = prepare_pt2e(gm, quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    converted = convert_pt2e(prepared)
    changed = dequantize_in_float32(converted)
    skipped = sorted({line.rsplit(",", 1)[-1].strip() for line in printed.getvalue().splitlines() if "No quant config" in line})
    return QnnQuantized(recompose, converted, norm_quantization(converted), decisions, removed, changed, skipped)


def quantization_by_norm(
    module: torch.nn.Module | GraphModule,
    example_inputs: Sequence[Any],
    calibration: Iterable[Sequence[Any]] | None = None,
    *,
    recompose: str = "edgefuse",
    **options: Any,
) -> dict[str, NormQuantization]:
    """How each norm of ``module`` is quantized for QNN, keyed like ``edgefuse report`` rows.

    The key is the norm's module path, or its ``mean`` node's name when it has no module (a report row's
    ``decision.module_path or decision.mean``). Calibrates on ``calibration``, by default on the example
    inputs alone. Raises :class:`QnnUnavailable` when the QNN quantizer cannot be imported.
    """
    inputs = list(calibration) if calibration is not None else [tuple(example_inputs)]
    result = quantize_for_qnn(module, example_inputs, inputs, recompose=recompose, **options)
    return {n.key: n for n in result.norms}
