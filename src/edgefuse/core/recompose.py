"""Rebuild each decomposed RMSNorm as one ``rms_norm`` node, or say why it stays decomposed."""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, field, replace
from typing import Iterable

import torch
from torch._guards import detect_fake_mode
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from edgefuse.core._fx import dtype_name, module_path
from edgefuse.core.casts import (
    are_ints,
    at_least,
    cast_source,
    dim_order_of,
    dtype_of,
    exact_ancestors,
    same_dim_order,
    same_shape,
    same_size,
    tensor_meta,
)
from edgefuse.core.constants import GraphConstants
from edgefuse.core.match import Failure, NormMatch, Permuted, Rejection, match_rms_norm, permuted_input
from edgefuse.core.ops import OpTable, Role, table_for
from edgefuse.core.profiles import FLOAT, QUANTIZED, BackendProfile, Precision, check_precision, get_profile, precision_of
from edgefuse.core.signature import sync_signature


_HALF = (torch.float16, torch.bfloat16)
#: The start of the reason of a norm left because reading the graph raised: a malformed graph, or a bug.
UNREADABLE = "edgefuse could not read this graph here"
#: Why a norm inside a subgraph (a branch or body of ``torch.cond``, ``while_loop``, ``map``, or a
#: grad-mode or autocast region a captured graph keeps apart) is left.
NESTED = "inside the subgraph {name}, which {op} runs: edgefuse rewrites the top-level graph only"
#: ``node.meta`` key marking a view a backend's shape limit added around an ``rms_norm`` (its input viewed
#: as ``[1, rows, D]``, or its output viewed back): layout, part of the norm, which computes nothing.
ROWS_VIEW = "edgefuse_rows_view"


@dataclass(frozen=True)
class Decision:
    """What happened to one candidate norm (one mean of squares): rebuilt or not, and why.

    Node names refer to the graph as it was before the rewrite; ``node`` names the new ``rms_norm`` (and
    ``weight`` the new constant, when edgefuse folded the weight into one);
    a norm inside a subgraph has its names qualified by the subgraph's (``true_graph_0.mean``);
    ``note`` says where the rebuilt node's arguments differ from how the model writes them, and why.
    """

    mean: str
    module_path: str | None
    form: str
    rebuilt: bool
    reason: str
    input: str | None = None
    weight: str | None = None
    eps: float | None = None
    dtype: torch.dtype | None = None
    normalized_shape: tuple[int, ...] | None = None
    node: str | None = None
    note: str | None = None


@dataclass
class RecomposeResult:
    """The rewritten graph module (rewritten in place), its program if one was given, and the decisions."""

    graph_module: GraphModule
    decisions: list[Decision] = field(default_factory=list)
    exported_program: ExportedProgram | None = None

    @property
    def rebuilt(self) -> list[Decision]:
        return [d for d in self.decisions if d.rebuilt]

    @property
    def left(self) -> list[Decision]:
        return [d for d in self.decisions if not d.rebuilt]


def recompose_rms_norm(
    graph_module: GraphModule | ExportedProgram,
    *,
    backend: str | BackendProfile = "aten",
    quantization_capture: bool = False,
    precision: Precision | None = None,
) -> RecomposeResult:
    """Rebuild every decomposed RMSNorm that ``backend`` can run, in place; one decision per candidate.

    ``graph_module`` is a captured ATen graph (``ExportedProgram.module()``) or an edge graph; pass an
    ``ExportedProgram`` to let edgefuse read lifted constants (edge graphs lift eps and the weights into
    program inputs). ``quantization_capture`` says that a captured graph is about to be quantized, which
    lets backends such as QNN take dtypes they would not run in float. ``precision`` is the precision the
    quantizer will quantize the norms at (a quantized name of :data:`~edgefuse.core.profiles.PRECISIONS`,
    or a function giving a norm's output node its own), so the profile's limits for it hold; without it
    a graph about to be quantized is in :data:`~edgefuse.core.profiles.QUANTIZED` (not known), any other
    in ``fp16``.
    """
    program = None
    if isinstance(graph_module, ExportedProgram):
        program, graph_module = graph_module, graph_module.graph_module
    if not isinstance(graph_module, GraphModule):
        raise TypeError(
            f"recompose_rms_norm takes a torch.fx.GraphModule or an ExportedProgram, not {type(graph_module).__name__}"
        )
    if not isinstance(quantization_capture, bool):
        raise TypeError(f"quantization_capture is True or False, got {quantization_capture!r}")
    precision = _checked_precision(precision, quantization_capture)
    if any(_traced_not_captured(node) for node in graph_module.graph.nodes):
        raise ValueError(
            "recompose_rms_norm reads ATen graphs (torch.export) and ExecuTorch edge graphs; this graph calls "
            "tensor methods or torch functions, as a torch.fx.symbolic_trace graph does: export the model with "
            "torch.export"
        )
    profile = get_profile(backend)
    table = table_for(graph_module.graph)
    if quantization_capture and table.dialect == "edge":
        raise ValueError(
            "quantization_capture=True is for captured ATen graphs about to be quantized, "
            "but this graph holds ExecuTorch edge ops"
        )
    run = _Pass(graph_module, table, profile, quantization_capture, precision, GraphConstants(graph_module, program))
    decisions = run.run() + _nested_decisions(graph_module)
    if program is not None and any(d.rebuilt for d in decisions):
        sync_signature(program)
    return RecomposeResult(graph_module, decisions, program)


def _checked_precision(precision: Precision | None, capture: bool) -> Precision:
    """The precision a run holds norms to: ``precision`` checked against ``capture``, or its default."""
    if precision is None:
        return QUANTIZED if capture else FLOAT
    if callable(precision):
        return precision
    if (check_precision(precision) == FLOAT) == capture:
        need = "a quantized precision" if capture else "fp16"
        raise ValueError(
            f"precision {precision!r} does not fit quantization_capture={capture}: a graph "
            f"{'about to be quantized' if capture else 'not about to be quantized'} takes {need}"
        )
    return precision


class _Pass:
    """One run over one graph under one backend profile: each mean is matched, each match planned
    (:class:`_Planner`, which changes nothing) and the first plan applied (:class:`_Rewriter`)."""

    def __init__(
        self, gm: GraphModule, table: OpTable, profile: BackendProfile, capture: bool, precision: Precision,
        constants: GraphConstants,
    ):
        self.gm, self.table = gm, table
        self.planner = _Planner(table, profile, capture, precision, constants)
        self.rewriter = _Rewriter(gm, table, constants)

    def run(self) -> list[Decision]:
        means = [n for n in self.gm.graph.nodes if self.table.is_a(n, Role.MEAN)]
        decisions = []
        modified = False
        replaced = self.rewriter.replaced
        for mean in means:
            if mean.graph is not self.gm.graph or mean._erased:
                continue
            decision = self._decide(mean)
            modified |= decision.rebuilt
            if decision.input in replaced or decision.weight in replaced:
                decision = replace(
                    decision,
                    input=replaced.get(decision.input, decision.input),
                    weight=replaced.get(decision.weight, decision.weight),
                )
            decisions.append(decision)
        if modified:
            self.gm.graph.lint()
            self.gm.recompile()
        return decisions

    def _decide(self, mean: Node) -> Decision:
        """Match the norm at ``mean``, plan each match, longest first, and apply the first plan; the decision
        says what was rebuilt, or the first match's reason to stay."""
        try:
            found = match_rms_norm(mean, self.table, self.planner.constants)
        except Exception as error:  # a malformed graph must leave the norm alone, never crash the pass
            return _decision(mean, f"{UNREADABLE}: {error!r}")
        if isinstance(found, Rejection):
            return _decision(mean, found.reason, found)
        reasons = []
        for match in found:
            plan = self.planner.plan(match)
            if isinstance(plan, Failure):
                reasons.append(plan.reason)
                continue
            node, weight = self.rewriter.apply(plan)
            return _decision(mean, "rebuilt", plan.match, rebuilt=node, weight=weight)
        return _decision(mean, reasons[0], found[0])


@dataclass(frozen=True)
class _Plan:
    """How one match is rebuilt, decided before the graph changes: the match as rebuilt (rule 9 may read
    another input; notes added), the weight the new node reads (a tensor becomes a new constant), the new
    node's metadata, and the views around it that a shape limit (``rows``) or rule 9 (``permuted``: the
    model's permutation and its output's metadata) adds."""

    match: NormMatch
    weight: Node | torch.Tensor | None
    value: torch.Tensor
    rows: _Rows | None
    permuted: tuple[Node, torch.Tensor] | None


class _Planner:
    """Decides, for one match under one backend profile, whether and how it is rebuilt; changes nothing."""

    def __init__(
        self, table: OpTable, profile: BackendProfile, capture: bool, precision: Precision, constants: GraphConstants
    ):
        self.table, self.profile, self.capture, self.constants = table, profile, capture, constants
        self.precision = precision
        #: The fake values of the norms planned so far, by what they depend on (see ``_rms_norm_meta``).
        self.made: dict[tuple, torch.Tensor] = {}

    def plan(self, match: NormMatch) -> _Plan | Failure:
        """How ``match`` is rebuilt, or why it stays; reading a malformed graph is a failure, never an error."""
        try:
            failure = self._reason(self.profile.shape_reason(match.normalized_shape), match)
            weight = self._weight_for(match) if failure is None else None
            failure = failure or (weight if isinstance(weight, Failure) else None) or self._reason(
                self.profile.dtype_reason(match.dtype, self.capture) or self._tensor_exponent_reason(match), match
            )
            value = _rms_norm_meta(tensor_meta(match.input), match, weight, self.made) if failure is None else None
        except Exception as error:
            failure = Failure(f"{UNREADABLE}: {error!r}")
        if failure is not None:
            return failure
        if value is None:
            return Failure("edgefuse could not compute the rebuilt node's metadata (no fake tensor mode in meta['val'])")
        expected = tensor_meta(match.output)
        permuted = None
        if value.dtype != expected.dtype or not same_dim_order(value, expected):
            layout = (
                f"a rebuilt rms_norm would produce {dtype_name(value.dtype)} in dim order {dim_order_of(value)} where the "
                f"norm produced {dtype_name(expected.dtype)} in dim order {dim_order_of(expected)}"
            )
            if value.dtype != expected.dtype:
                return Failure(layout, match.output)
            try:  # rule 9
                found = self._on_permuted_input(match, weight, expected)
            except Exception as error:
                found = Failure(f"{UNREADABLE}: {error!r}")
            if isinstance(found, Failure):
                return Failure(f"{layout}, and {found.reason}", found.source)
            match, value, permuted = found
        precision = self._precision(match, value)  # outside the guard: a bad precision is the caller's error
        try:  # a backend's shape limit, on the input the rebuilt norm reads (after rule 9's swap)
            rows = self._rows_for(match, weight, value, precision)
            note = rows.note if isinstance(rows, _Rows) else self._unremedied(match, precision) if rows is None else None
        except Exception as error:
            rows = Failure(f"{UNREADABLE}: {error!r}")
        if isinstance(rows, Failure):
            return rows
        if note is not None:
            match = replace(match, note=f"{match.note}; {note}" if match.note else note)
        blocker = self.constants.mutations.between(_reads(match, self.table), match.output)
        if blocker is not None:
            return Failure(
                f"the in-place op {blocker.name} runs inside the norm: a rebuilt rms_norm would read its input "
                "and weight after it, where the model read them before",
                blocker,
            )
        return _Plan(match, weight, value, rows, permuted)

    @staticmethod
    def _reason(reason: str | None, match: NormMatch) -> Failure | None:
        """A profile's reason to leave ``match``, as a failure about its mean (None: no reason)."""
        return Failure(reason, match.mean) if reason else None

    def _tensor_exponent_reason(self, match: NormMatch) -> str | None:
        """Why a norm whose square or root is a ``pow`` by a constant tensor stays, or None.

        ATen computes ``pow`` by a tensor with its general power function and ``pow`` by a number 2, -0.5
        or 0.5 as a square, rsqrt or sqrt: in float32 and float64 the two round differently, in float16
        and bfloat16 (computed in float32, then rounded) alike. A backend whose pipelines lift every
        scalar operand into such a tensor (``lifts_scalars``, QNN's) has it stand for the model's number,
        and computes the whole norm in its own arithmetic either way.
        """
        if self.profile.lifts_scalars:
            return None
        for node in match.nodes:
            exponent = node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")
            dtype = dtype_of(node)
            if self.table.is_a(node, Role.POW) and isinstance(exponent, Node) and dtype not in _HALF:
                return (
                    f"{node.name} raises to a power held in the tensor {exponent.name}: in {dtype_name(dtype)} that "
                    "rounds differently from the square or root a rebuilt rms_norm computes"
                )
        return None

    def _weight_for(self, match: NormMatch) -> Node | torch.Tensor | None | Failure:
        """The weight the new node reads: a node, a tensor to add as a constant, None, or why there is none."""
        weight = match.weight
        if weight is None:
            return None
        if not self.profile.constant_weight and not self.profile.one_dtype:
            return weight.node
        wanted = match.dtype if self.profile.one_dtype else None
        for node in exact_ancestors(weight.node, self.table):
            if (wanted is None or dtype_of(node) == wanted) and (
                not self.profile.constant_weight or self.constants.is_constant(node)
            ):
                return node
        if weight.root is None:
            source = list(exact_ancestors(weight.node, self.table))[-1]
            needs = f"{self.profile.name} needs a constant weight"
            kind = self.constants.source_kind(source)
            if kind == "user input":
                return Failure(f"the weight {source.name} is an input of the model, not a constant; {needs}", weight.node)
            if kind == "written state":
                return Failure(f"the weight {source.name} is state the model writes in place, not a constant; {needs}", weight.node)
            if source.op == "placeholder" and self.constants.program is None:
                return Failure(
                    f"the weight {source.name} is a graph input; pass the ExportedProgram so edgefuse can tell a "
                    f"parameter from a user input ({needs})",
                    weight.node,
                )
            return Failure(f"the weight {weight.node.name} is computed at run time; {needs}", weight.node)
        other_dtype = wanted is not None and dtype_of(weight.node) != wanted
        if other_dtype and not at_least(wanted, dtype_of(weight.node)):
            return Failure(
                f"the weight {weight.node.name} is {dtype_name(dtype_of(weight.node))} and {self.profile.name} takes one "
                f"dtype ({dtype_name(wanted)}): rounding the weight would move a rounding",
                weight.node,
            )
        folded = self.constants.fold(weight.node, self.table)
        if folded is None:
            return Failure(f"the weight {weight.node.name} could not be folded into a constant", weight.node)
        # a narrower weight the multiply promotes (a bfloat16 weight on a float32 norm): widening is exact
        return folded if wanted is None else folded.to(wanted)

    def _on_permuted_input(
        self, match: NormMatch, weight: Node | torch.Tensor | None, expected: torch.Tensor
    ) -> tuple[NormMatch, torch.Tensor, tuple[Node, torch.Tensor]] | Failure:
        """Rule 9: the match rebuilt on the tensor its permuted input views, the rebuilt node's metadata, and
        the permute with the metadata of the permuted output; or why the layout cannot be kept so."""
        found = permuted_input(match, self.table)
        if isinstance(found, Failure):
            return found
        how = f"rebuilt on {found.base.name} and permuted by {found.permute.name}"
        note = f"{how} after it, as the model's input was, so the output keeps the model's layout"
        rebuilt = replace(match, input=found.base, note=f"{match.note}; {note}" if match.note else note)
        value = _rms_norm_meta(tensor_meta(rebuilt.input), rebuilt, weight, self.made)
        out = _permuted_meta(found, value) if value is not None else None
        if out is None:
            return Failure(f"edgefuse could not compute the metadata of the norm {how}", found.permute)
        if not (same_shape(out, expected) and all(same_size(a, b) for a, b in zip(out.stride(), expected.stride()))):
            return Failure(
                f"{how}, it would have shape {list(out.shape)} and strides {list(out.stride())} where the norm "
                f"produced {list(expected.shape)} and {list(expected.stride())}",
                found.permute,
            )
        return rebuilt, value, (found.permute, out)

    def _precision(self, match: NormMatch, value: torch.Tensor) -> str:
        """The precision the ``rms_norm`` rebuilt from ``match`` is computed in, checked.

        A function of nodes is asked about a node that stands for that ``rms_norm`` (its target, the norm
        output's module path and the rebuilt node's metadata ``value``), never about the pieces: a
        quantizer picks a node's config by the node it annotates, and a recipe keyed on
        ``aten.rms_norm`` would not match the output's ``mul`` or cast.
        """
        if not callable(self.precision):
            return check_precision(self.precision)
        out = match.output
        stand_in = Node(out.graph, f"{out.name}_rebuilt", "call_function", self.table.rms_norm, (), {})
        stand_in.meta.update({k: v for k, v in out.meta.items() if k in ("nn_module_stack", "stack_trace")})
        stand_in.meta["val"] = value
        return precision_of(self.precision, stand_in)

    def _unremedied(self, match: NormMatch, precision: str) -> str | None:
        """What was measured wrong on the rebuilt norm's input shape in ``precision`` that no limit held
        there remedies, as its decision's note, or None."""
        x = tensor_meta(match.input)
        shape = tuple(int(d) if isinstance(d, int) else None for d in x.shape)
        unremedied = self.profile.unremedied(shape, precision)
        covers = f"no limit of {self.profile.name} covers {list(x.shape)} in {precision}"
        return None if unremedied is None else f"{covers}; yet {unremedied}"

    def _rows_for(
        self, match: NormMatch, weight: Node | torch.Tensor | None, value: torch.Tensor, precision: str
    ) -> _Rows | Failure | None:
        """How a :class:`~edgefuse.core.profiles.ShapeLimit` of the profile has the norm rebuilt: None when no
        limit covers the input the rebuilt node reads, a ``[1, rows, D]`` view of it to normalize instead
        (``value``, the rebuilt norm's metadata, is what the view back must produce; ``precision``, what it is
        computed in), or why it stays."""
        x = tensor_meta(match.input)
        shape = tuple(int(d) if isinstance(d, int) else None for d in x.shape)
        limit = self.profile.limit_for(shape, precision)
        if limit is None:
            return None
        wrong = (
            f"{self.profile.name} computes rms_norm wrong for an input of shape {list(x.shape)} in {precision} "
            f"({limit.name}: {limit.measured})"
        )
        if limit.remedy == "leave":
            return Failure(wrong, match.input)
        if None in shape:
            return Failure(f"{wrong}, and the rows of this one are not known when the program is built", match.input)
        if not x.is_contiguous():
            return Failure(f"{wrong}, and this input is not contiguous, so it has no [1, rows, D] view", match.input)
        rows = (1, math.prod(shape[:-1]), shape[-1])
        viewed = _viewed(x, rows, self.table.view)
        normalized = _rms_norm_meta(viewed, match, weight, self.made)
        back = _viewed(normalized, shape, self.table.view) if normalized is not None else None
        mine, theirs = _properties(back) if back is not None else None, _properties(value)
        if mine is None or theirs is None or mine[1:5] != theirs[1:5]:  # shape, strides, offset, dtype
            layout = "edgefuse could not show that a norm of its [1, rows, D] view keeps its layout"
            return Failure(f"{wrong}, and {layout}", match.input)
        return _Rows(rows, shape, viewed, normalized, f"rebuilt on a {list(rows)} view of its input: {wrong}")


class _Rewriter:
    """Applies plans to one graph: the only code that changes it."""

    def __init__(self, gm: GraphModule, table: OpTable, constants: GraphConstants):
        self.gm, self.table, self.constants = gm, table, constants
        #: The name, before the rewrite, of the norm output each new ``rms_norm`` replaced: a later norm
        #: that reads a rebuilt one (``n(n(x))``) names its input as the graph had it.
        self.replaced: dict[str, str] = {}

    def apply(self, plan: _Plan) -> tuple[Node, Node | None]:
        """Replace the planned match with one ``rms_norm`` (viewed and permuted as planned); returns the new
        node and the weight node it reads."""
        match, weight, value, rows, permuted = plan.match, plan.weight, plan.value, plan.rows, plan.permuted
        if isinstance(weight, torch.Tensor):
            weight = self.constants.add("rms_norm_weight", weight, before=match.output)
        graph = self.gm.graph
        copied = {k: v for k, v in match.output.meta.items() if k in ("nn_module_stack", "stack_trace")}

        def add(target, args: tuple, val: torch.Tensor, kwargs: dict | None = None) -> Node:
            new = graph.call_function(target, args, kwargs or {})
            new.meta.update(copied)
            new.meta["val"] = val
            return new

        with graph.inserting_before(match.output):
            source = match.input if rows is None else add(self.table.view, (match.input, list(rows.rows)), rows.viewed)
            node = add(self.table.rms_norm, (source, list(match.normalized_shape), weight, match.eps),
                       value if rows is None else rows.value)
            made = [node]
            if rows is not None:  # the backend's limit: the rebuilt output viewed back in the input's shape
                made.append(add(self.table.view, (node, list(rows.shape)), value))
                source.meta[ROWS_VIEW] = made[-1].meta[ROWS_VIEW] = True
            if permuted is not None:  # rule 9: the model's permutation, now of the rebuilt output
                view, out_value = permuted
                made.append(add(view.target, (made[-1], *view.args[1:]), out_value, dict(view.kwargs)))
        for new in made:
            self.replaced[new.name] = self.replaced.get(match.output.name, match.output.name)
        match.output.replace_all_uses_with(made[-1])
        _erase_dead(match.nodes, self.table)
        return node, weight


@dataclass(frozen=True)
class _Rows:
    """A norm rebuilt on its input viewed as ``rows`` (``[1, rows, D]``, metadata ``viewed``), whose
    ``rms_norm`` produces ``value`` and is viewed back in ``shape``; ``note`` says why."""

    rows: tuple[int, ...]
    shape: tuple[int, ...]
    viewed: torch.Tensor
    value: torch.Tensor
    note: str


def _traced_not_captured(node: Node) -> bool:
    """Whether a node calls a tensor method or a Python-level torch function (``torch.mean``,
    ``F.rms_norm``): a graph from ``torch.fx.symbolic_trace``, whose norms no table can read."""
    if node.op == "call_method":
        return True
    if node.op != "call_function" or isinstance(node.target, torch._ops.OperatorBase):
        return False
    module = getattr(node.target, "__module__", None) or ""
    builtin = isinstance(node.target, types.BuiltinFunctionType)  # torch.mean, not torch.sym_max
    return (module == "torch" and builtin) or module.startswith("torch.nn.functional")


def _reads(match: NormMatch, table: OpTable) -> set[Node]:
    """The nodes at which the model reads the norm's input and weight: the matched nodes and the casts they read."""
    reads = set(match.nodes)
    for node in match.nodes:
        for arg in node.all_input_nodes:
            reads.update(a for a in exact_ancestors(arg, table) if cast_source(a, table) is not None)
    return reads


def _rms_norm_meta(
    x: torch.Tensor | None, match: NormMatch, weight: Node | torch.Tensor | None, made: dict
) -> torch.Tensor | None:
    """The fake tensor ``aten.rms_norm`` produces for the fake input ``x`` (the match's input, or a view
    of it) and the match's weight.

    ``made`` holds, for one pass, the value computed for each kind of input and weight: a norm of the same
    kind as an earlier one gets a clone of that value (one fake op, where ``rms_norm`` takes about ten)
    when the clone has every property the value has (shape, strides, dtype, device, requires_grad; only
    its autograd node is a clone's); otherwise ``rms_norm`` is run again.
    """
    mode = detect_fake_mode([x]) if x is not None else None
    if mode is None:
        return None
    w = tensor_meta(weight) if isinstance(weight, Node) else weight
    key = _meta_key(mode, x, w, match)
    earlier = made.get(key) if key is not None else None
    with mode:
        if earlier is not None:
            value = earlier.clone()
            if _properties(value) == _properties(earlier):
                return value
        if isinstance(w, torch.Tensor) and not isinstance(w, torch._subclasses.FakeTensor):
            w = mode.from_tensor(w, static_shapes=True)
        value = torch.ops.aten.rms_norm.default(x, list(match.normalized_shape), w, match.eps)
    if key is not None:
        made[key] = value
    return value


def _properties(value: torch.Tensor) -> tuple | None:
    """What a fake tensor's metadata says of it, or None when some size or stride is symbolic."""
    if value.layout != torch.strided:
        return None
    if not are_ints((*value.shape, *value.stride(), value.storage_offset())):
        return None
    return (
        type(value), tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device,
        value.requires_grad, value.is_leaf,
    )


def _meta_key(mode: object, x: torch.Tensor, w: torch.Tensor | None, match: NormMatch) -> tuple | None:
    """What ``aten.rms_norm``'s fake output depends on; None when it cannot be told (symbolic sizes)."""
    x_properties = _properties(x)
    w_properties = _properties(w) if isinstance(w, torch.Tensor) else ()
    if x_properties is None or w_properties is None or w is not None and not isinstance(w, torch.Tensor):
        return None
    return (id(mode), x_properties, w_properties, tuple(match.normalized_shape), match.eps, torch.is_grad_enabled())


def _viewed(x: torch.Tensor, shape: tuple[int, ...], view) -> torch.Tensor:
    """The fake tensor the graph's ``view`` op (``aten.view``, which keeps the storage offset, or the edge
    dialect's ``view_copy``) makes of the fake tensor ``x`` in ``shape``."""
    with detect_fake_mode([x]):
        return view(x, list(shape))


def _permuted_meta(found: Permuted, value: torch.Tensor) -> torch.Tensor | None:
    """The fake tensor ``found.permute`` makes of ``value``, a fake tensor; None when it cannot be applied."""
    mode = detect_fake_mode([value])
    if mode is None:
        return None
    view = found.permute
    with mode:
        try:
            return view.target(value, *view.args[1:], **view.kwargs)
        except Exception:  # arguments edgefuse cannot replay leave the norm alone
            return None


def _erase_dead(nodes: Iterable[Node], table: OpTable) -> None:
    """Erase the given nodes and what they read once nothing uses them; only ops edgefuse knows are pure."""
    work = list(nodes)
    while work:
        node = work.pop()
        if node._erased or node.op not in ("call_function", "get_attr"):
            continue
        if node.op == "call_function" and table.role(node) in (None, Role.ASSERT_METADATA):
            continue
        users = list(node.users)
        if any(not table.is_a(u, Role.ASSERT_METADATA) for u in users):
            continue
        for user in users:
            node.graph.erase_node(user)
        inputs = [a for a in node.all_input_nodes]
        node.graph.erase_node(node)
        work.extend(inputs)


def _nested_decisions(gm: GraphModule, prefix: str = "", seen: set[int] | None = None) -> list[Decision]:
    """One decision per mean inside the subgraphs ``gm`` holds (branches and bodies of higher-order ops:
    ``torch.cond``, ``while_loop``, ``map``, grad-mode and autocast regions), each left with the reason
    :data:`NESTED`, or with its own reason where it is no norm. Node names are qualified by the subgraph's
    (``true_graph_0.mean``) so none clashes with the top-level graph's; each subgraph is read once, in its
    own dialect."""
    seen = set() if seen is None else seen
    decisions = []
    for node in gm.graph.nodes:
        sub = _attribute(gm, node.target) if node.op == "get_attr" else None
        if not isinstance(sub, GraphModule) or id(sub) in seen:
            continue
        seen.add(id(sub))
        name = f"{prefix}{node.target}"
        users = [getattr(u.target, "__name__", str(u.target)) for u in node.users if u.op == "call_function"]
        reason = NESTED.format(name=name, op=users[0] if users else "a higher-order op")
        table = table_for(sub.graph)

        def qualified(value: str | None) -> str | None:
            return f"{name}.{value}" if value is not None else None

        for mean in (n for n in sub.graph.nodes if table.is_a(n, Role.MEAN)):
            try:
                found = match_rms_norm(mean, table, GraphConstants(sub, None))
            except Exception as error:  # a malformed subgraph must not crash the pass either
                found = Rejection(mean, f"{UNREADABLE}: {error!r}")
            if isinstance(found, Rejection):
                decision = _decision(mean, found.reason, found)
            else:
                decision = _decision(mean, reason, found[0])
            decisions.append(replace(decision, mean=qualified(decision.mean), input=qualified(decision.input),
                                     weight=qualified(decision.weight)))
        decisions += _nested_decisions(sub, f"{name}.", seen)
    return decisions


def _attribute(gm: GraphModule, target: str) -> object:
    value: object = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _decision(
    mean: Node,
    reason: str,
    found: NormMatch | Rejection | None = None,
    rebuilt: Node | None = None,
    weight: Node | None = None,
) -> Decision:
    """The decision about the norm whose mean is ``mean``: the one place a :class:`Decision` is built.

    ``found`` is the match or the rejection the decision rests on (None: the graph could not be read);
    for a rebuilt norm, ``rebuilt`` is the new ``rms_norm`` node and ``weight`` the weight node it reads.
    """
    path = module_path(mean)
    if found is None:
        return Decision(mean=mean.name, module_path=path, form="unknown", rebuilt=False, reason=reason)
    if isinstance(found, Rejection):
        return Decision(
            mean=found.mean.name, module_path=path, form=found.form, rebuilt=False, reason=reason,
            input=found.input.name if found.input is not None else None,
            weight=found.weight.name if found.weight is not None else None,
            eps=found.eps,
        )
    if rebuilt is None:
        weight_name = found.weight.node.name if found.weight else None
    else:
        weight_name = weight.name if weight is not None else None
    return Decision(
        mean=mean.name, module_path=path, form=found.form, rebuilt=rebuilt is not None, reason=reason,
        input=found.input.name, weight=weight_name, eps=found.eps, dtype=found.dtype,
        normalized_shape=found.normalized_shape,
        node=rebuilt.name if rebuilt is not None else None,
        note=found.note if rebuilt is not None else None,
    )
