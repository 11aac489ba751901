"""Every ``rms_norm`` a graph holds, held to a backend's shape limits: kept, viewed as ``[1, rows, D]``, or
left with the reason.

The recomposition (:mod:`edgefuse.core.recompose`) applies a profile's :class:`~edgefuse.core.profiles.ShapeLimit`
to the norms it rebuilds. A norm the model writes whole (``torch.nn.RMSNorm``, ``F.rms_norm``: one
``aten.rms_norm`` in a captured graph, ``rms_norm`` of the edge dialect after it) reaches the backend as
written; this pass gives it the same remedy. A covered norm reads a ``[1, rows, D]`` view of its input,
and its output is viewed back in the input's shape, so the model's values and layout come out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch._guards import detect_fake_mode
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from edgefuse.core._fx import module_path
from edgefuse.core.casts import tensor_meta
from edgefuse.core.ops import OpTable, Role, table_for
from edgefuse.core.profiles import FLOAT, QUANTIZED, BackendProfile, Precision, check_precision, get_profile, precision_of
from edgefuse.core.recompose import ROWS_VIEW, _properties, _viewed
from edgefuse.core.signature import sync_signature

#: What the pass did with one norm.
KEPT, VIEWED, LEFT = "kept", "viewed", "left"


@dataclass(frozen=True)
class Legalized:
    """What happened to one ``rms_norm`` node under a profile's limits.

    ``node`` names the norm as the graph had it; ``shape`` is its input's shape (None for a size not known
    when the program is built); ``action`` is :data:`KEPT` (no limit covers it), :data:`VIEWED` (it now
    normalizes a ``[1, rows, D]`` view) or :data:`LEFT` (a limit covers it and no view keeps its values
    and layout); ``limit`` names the limit that covers it, ``reason`` says why (for a kept norm, also what
    was measured wrong on its shape in its precision that edgefuse does not remedy).
    """

    node: str
    module_path: str | None
    shape: tuple[int | None, ...] | None
    action: str
    reason: str
    limit: str | None = None


@dataclass
class LegalizeResult:
    """The graph module (rewritten in place) and one :class:`Legalized` per norm."""

    graph_module: GraphModule
    norms: list[Legalized] = field(default_factory=list)

    @property
    def viewed(self) -> list[Legalized]:
        return [n for n in self.norms if n.action == VIEWED]


def legalize_rms_norm(
    graph_module: GraphModule | ExportedProgram,
    *,
    backend: str | BackendProfile = "aten",
    precision: Precision = FLOAT,
) -> LegalizeResult:
    """Hold every top-level ``rms_norm`` of the graph to the shape limits of ``backend``, in place.

    ``precision`` is what each norm is computed in (:data:`~edgefuse.core.profiles.PRECISIONS`): ``fp16``
    for a float graph, the quantizer's precision for a graph about to be quantized, or
    :data:`~edgefuse.core.profiles.QUANTIZED` when that precision is not known; a function gives each norm
    node its own. A norm that reads a dequantized tensor is quantized already (in ``QUANTIZED`` when
    ``precision`` says ``fp16``) and is never viewed: a view there would sit between the norm and the
    quantize and dequantize ops QNN reads its encodings from, so quantized limits are applied during
    capture, where the quantizer has views share their input's encoding.
    """
    program = graph_module if isinstance(graph_module, ExportedProgram) else None
    if program is not None:
        graph_module = program.graph_module
    if not isinstance(graph_module, GraphModule):
        raise TypeError(
            f"legalize_rms_norm takes a torch.fx.GraphModule or an ExportedProgram, not {type(graph_module).__name__}"
        )
    profile = get_profile(backend)
    if not callable(precision):
        check_precision(precision)
    table = table_for(graph_module.graph)
    norms = [n for n in graph_module.graph.nodes if table.is_a(n, Role.RMS_NORM)]
    computed = [precision_of(precision, norm) for norm in norms]  # every one checked before any view is made
    result = LegalizeResult(graph_module, [_legalize(n, table, profile, p) for n, p in zip(norms, computed)])
    if result.viewed:
        graph_module.graph.lint()
        graph_module.recompile()
        if program is not None:
            sync_signature(program)
    return result


def _legalize(norm: Node, table: OpTable, profile: BackendProfile, computed: str) -> Legalized:
    """Decide on one norm, computed in ``computed`` (checked), and, when it is to be viewed, view it; the
    graph changes only then."""
    x = norm.args[0] if norm.args else None
    value, out = tensor_meta(x), tensor_meta(norm)
    path = module_path(norm)
    if value is None or out is None:
        return Legalized(norm.name, path, None, LEFT, "its input or output has no metadata (meta['val'])")
    shape = tuple(int(d) if isinstance(d, int) else None for d in value.shape)
    after_quantization = isinstance(x, Node) and table.is_a(x, Role.DEQUANTIZE)
    if after_quantization and computed == FLOAT:
        computed = QUANTIZED
    limit = profile.limit_for(shape, computed)
    if limit is None:
        kept = f"no limit of {profile.name} covers {list(value.shape)} in {computed}"
        unremedied = profile.unremedied(shape, computed)
        return Legalized(norm.name, path, shape, KEPT, kept if unremedied is None else f"{kept}; yet {unremedied}")
    wrong = (
        f"{profile.name} computes rms_norm wrong for an input of shape {list(value.shape)} in {computed} "
        f"({limit.name}: {limit.measured})"
    )

    def left(why: str) -> Legalized:
        return Legalized(norm.name, path, shape, LEFT, f"{wrong}, and {why}", limit.name)

    if limit.remedy != "rows":
        return left(f"its remedy is {limit.remedy!r}: a whole norm has no pieces to leave it in")
    if after_quantization:
        return left("it is quantized already: a view would sit between it and the quantize and dequantize ops around it")
    if None in shape:
        return left("the rows of this one are not known when the program is built")
    if len(norm.args) > 1 and len(norm.args[1]) > 1:
        return left("it normalizes over several trailing dims: no [1, rows, D] view")
    if not value.is_contiguous():
        return left("this input is not contiguous, so it has no [1, rows, D] view")
    rows = (1, math.prod(shape[:-1]), shape[-1])
    try:
        viewed = _viewed(value, rows, table.view)
        normalized = _normalized(norm, viewed)
        back = _viewed(normalized, shape, table.view)
    except Exception as error:  # a malformed graph leaves the norm as it is, never crashes the pass
        return left(f"edgefuse could not compute the view's metadata: {error!r}")
    mine, theirs = _properties(back), _properties(out)
    if mine is None or theirs is None or mine[1:5] != theirs[1:5]:  # shape, strides, offset, dtype
        return left("a norm of its [1, rows, D] view would not produce the layout the graph expects")
    _view(norm, table, rows, shape, viewed, normalized, back)
    return Legalized(norm.name, path, shape, VIEWED, f"normalized on a {list(rows)} view of its input: {wrong}", limit.name)


def _normalized(norm: Node, viewed: torch.Tensor) -> torch.Tensor:
    """The fake tensor ``norm``'s op makes of the fake input ``viewed``, with the norm's other arguments."""
    args = tuple(tensor_meta(a) if isinstance(a, Node) else a for a in norm.args[1:])
    kwargs = {k: tensor_meta(v) if isinstance(v, Node) else v for k, v in norm.kwargs.items()}
    with detect_fake_mode([viewed]):
        return norm.target(viewed, *args, **kwargs)


def _view(
    norm: Node, table: OpTable, rows: tuple[int, ...], shape: tuple[int, ...], viewed: torch.Tensor,
    normalized: torch.Tensor, back: torch.Tensor,
) -> None:
    """Have ``norm`` read its input viewed as ``rows`` and hand its users its output viewed back in ``shape``."""
    graph = norm.graph
    copied = {k: v for k, v in norm.meta.items() if k in ("nn_module_stack", "stack_trace")}
    with graph.inserting_before(norm):
        source = graph.call_function(table.view, (norm.args[0], list(rows)))
    with graph.inserting_after(norm):
        restored = graph.call_function(table.view, (norm, list(shape)))
    norm.replace_all_uses_with(restored, delete_user_cb=lambda user: user is not restored)
    norm.args = (source, *norm.args[1:])
    for node, value in ((source, viewed), (norm, normalized), (restored, back)):
        node.meta.update(copied)
        node.meta["val"] = value
    source.meta[ROWS_VIEW] = restored.meta[ROWS_VIEW] = True
