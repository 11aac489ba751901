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

from edgefuse.casts import at_least, cast_source, dim_order_of, dtype_of, exact_ancestors, tensor_meta
from edgefuse.constants import GraphConstants
from edgefuse.match import NormMatch, Rejection, match_rms_norm
from edgefuse.ops import OpTable, Role, table_for
from edgefuse.profiles import BackendProfile, get_profile
from edgefuse.signature import sync_signature


#: The start of the reason of a norm left because reading the graph raised: a malformed graph, or a bug.
UNREADABLE = "edgefuse could not read this graph here"
#: Why a norm inside a subgraph (a branch or body of ``torch.cond``, ``while_loop``, ``map``, or a
#: grad-mode or autocast region a captured graph keeps apart) is left.
NESTED = "inside the subgraph {name}, which {op} runs: edgefuse rewrites the top-level graph only"


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
) -> RecomposeResult:
    """Rebuild every decomposed RMSNorm that ``backend`` can run, in place; one decision per candidate.

    ``graph_module`` is a captured ATen graph (``ExportedProgram.module()``) or an edge graph; pass an
    ``ExportedProgram`` to let edgefuse read lifted constants (edge graphs lift eps and the weights into
    program inputs). ``quantization_capture`` says that a captured graph is about to be quantized, which
    lets backends such as QNN take dtypes they would not run in float.
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
    rewriter = _Rewriter(graph_module, table, profile, quantization_capture, GraphConstants(graph_module, program))
    decisions = rewriter.run() + _nested_decisions(graph_module)
    if program is not None and any(d.rebuilt for d in decisions):
        sync_signature(program)
    return RecomposeResult(graph_module, decisions, program)


class _Rewriter:
    """Applies matches to one graph under one backend profile."""

    def __init__(self, gm: GraphModule, table: OpTable, profile: BackendProfile, capture: bool, constants: GraphConstants):
        self.gm, self.table, self.profile, self.capture, self.constants = gm, table, profile, capture, constants
        #: The name, before the rewrite, of the norm output each new ``rms_norm`` replaced: a later norm
        #: that reads a rebuilt one (``n(n(x))``) names its input as the graph had it.
        self.replaced: dict[str, str] = {}

    def run(self) -> list[Decision]:
        means = [n for n in self.gm.graph.nodes if self.table.is_a(n, Role.MEAN)]
        decisions = []
        modified = False
        for mean in means:
            if mean.graph is not self.gm.graph or mean._erased:
                continue
            decision = self._decide(mean)
            modified |= decision.rebuilt
            decisions.append(replace(
                decision,
                input=self.replaced.get(decision.input, decision.input),
                weight=self.replaced.get(decision.weight, decision.weight),
            ))
        if modified:
            self.gm.graph.lint()
            self.gm.recompile()
        return decisions

    def _decide(self, mean: Node) -> Decision:
        path = _module_path(mean)
        try:
            found = match_rms_norm(mean, self.table, self.constants)
        except Exception as error:  # a malformed graph must leave the norm alone, never crash the pass
            return Decision(mean.name, path, "unknown", False, f"{UNREADABLE}: {error!r}")
        if isinstance(found, Rejection):
            return _rejected(found, path)
        reasons = []
        for match in found:
            view = None
            try:  # everything before the graph is changed; a malformed graph must leave the norm alone
                reason = self.profile.shape_reason(match.normalized_shape)
                weight = self._weight_for(match) if reason is None else None
                reason = reason or (weight if isinstance(weight, str) else self._profile_reason(match))
                view = self._view_for(match) if reason is None else None
                reason = reason or (view if isinstance(view, str) else None)
                value = _rms_norm_meta(match, weight, view) if reason is None else None
            except Exception as error:
                reason = f"{UNREADABLE}: {error!r}"
            outcome = self._rewrite(match, weight, value, view) if reason is None else reason
            if isinstance(outcome, str):
                reasons.append(outcome)
                continue
            node, weight_node = outcome
            note = "; ".join(n for n in (match.note, view.note if view is not None else None) if n) or None
            return Decision(
                mean.name, path, match.form, True, "rebuilt", match.input.name,
                weight_node.name if weight_node is not None else None,
                match.eps, match.dtype, match.normalized_shape, node.name, note,
            )
        longest = found[0]
        return Decision(
            mean.name, path, longest.form, False, reasons[0], longest.input.name,
            longest.weight.node.name if longest.weight else None, longest.eps, longest.dtype, longest.normalized_shape,
        )

    def _profile_reason(self, match: NormMatch) -> str | None:
        return self.profile.dtype_reason(match.dtype, self.capture)

    def _view_for(self, match: NormMatch) -> _RowsView | str | None:
        """How a profile's :class:`~edgefuse.profiles.ShapeLimit` has the norm rebuilt: None when none covers
        its input, a view of the input to normalize instead, or the reason it stays decomposed."""
        x = tensor_meta(match.input)
        shape = tuple(int(d) if isinstance(d, int) else None for d in x.shape)
        limit = self.profile.limit_for(shape, self.capture)
        if limit is None:
            return None
        wrong = (
            f"{self.profile.name} computes rms_norm wrong for an input of shape {list(x.shape)} "
            f"({limit.name}: {limit.measured})"
        )
        if limit.remedy == "leave":
            return wrong
        if None in shape:
            return f"{wrong}, and the rows of this one are not known when the program is built"
        if not x.is_contiguous():
            return f"{wrong}, and this input is not contiguous, so it has no [1, rows, D] view"
        rows = (1, math.prod(shape[:-1]), shape[-1])
        return _RowsView(rows, shape, f"rebuilt on a {list(rows)} view of its input: {wrong}")

    def _weight_for(self, match: NormMatch) -> Node | torch.Tensor | None | str:
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
                return f"the weight {source.name} is an input of the model, not a constant; {needs}"
            if kind == "written state":
                return f"the weight {source.name} is state the model writes in place, not a constant; {needs}"
            if source.op == "placeholder" and self.constants.program is None:
                return (
                    f"the weight {source.name} is a graph input; pass the ExportedProgram so edgefuse can tell a "
                    f"parameter from a user input ({needs})"
                )
            return f"the weight {weight.node.name} is computed at run time; {needs}"
        other_dtype = wanted is not None and dtype_of(weight.node) != wanted
        if other_dtype and not at_least(wanted, dtype_of(weight.node)):
            return (
                f"the weight {weight.node.name} is {_name(dtype_of(weight.node))} and {self.profile.name} takes one "
                f"dtype ({_name(wanted)}): rounding the weight would move a rounding"
            )
        folded = self.constants.fold(weight.node, self.table)
        if folded is None:
            return f"the weight {weight.node.name} could not be folded into a constant"
        # a narrower weight the multiply promotes (a bfloat16 weight on a float32 norm): widening is exact
        return folded if wanted is None else folded.to(wanted)

    def _rewrite(
        self, match: NormMatch, weight: Node | torch.Tensor | None, value: torch.Tensor | None,
        view: _RowsView | None = None,
    ) -> tuple[Node, Node | None] | str:
        """Replace the matched nodes with one ``rms_norm`` reading ``weight`` and producing ``value``, or say why not.

        With ``view``, the ``rms_norm`` normalizes a view of the input in ``view.rows`` and its result is
        viewed back in the input's shape; ``value`` is then what the view back produces."""
        expected = tensor_meta(match.output)
        if value is None:
            return "edgefuse could not compute the rebuilt node's metadata (no fake tensor mode in meta['val'])"
        if value.dtype != expected.dtype or dim_order_of(value) != dim_order_of(expected):
            return (
                f"a rebuilt rms_norm would produce {_name(value.dtype)} in dim order {dim_order_of(value)} where the "
                f"norm produced {_name(expected.dtype)} in dim order {dim_order_of(expected)}"
            )
        blocker = self.constants.mutations.between(_reads(match, self.table), match.output)
        if blocker is not None:
            return (
                f"the in-place op {blocker.name} runs inside the norm: a rebuilt rms_norm would read its input "
                "and weight after it, where the model read them before"
            )
        if isinstance(weight, torch.Tensor):
            weight = self.constants.add("rms_norm_weight", weight, before=match.output)
        graph = self.gm.graph
        kept = {k: v for k, v in match.output.meta.items() if k in ("nn_module_stack", "stack_trace")}
        with graph.inserting_before(match.output):
            source = match.input
            if view is not None:
                source = graph.call_function(self.table.view, (match.input, list(view.rows)))
                source.meta.update(kept)
                source.meta["val"] = _viewed(tensor_meta(match.input), view.rows)
            node = graph.call_function(self.table.rms_norm, (source, list(match.normalized_shape), weight, match.eps))
            node.meta.update(kept)
            output = node
            if view is not None:
                node.meta["val"] = _rms_norm_value(source.meta["val"], match, weight)
                output = graph.call_function(self.table.view, (node, list(view.shape)))
                output.meta.update(kept)
        output.meta["val"] = value
        self.replaced[output.name] = self.replaced.get(match.output.name, match.output.name)
        match.output.replace_all_uses_with(output)
        _erase_dead(match.nodes, self.table)
        return node, weight


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


@dataclass(frozen=True)
class _RowsView:
    """A norm rebuilt on its input viewed as ``rows`` (``[1, rows, D]``), its result viewed back in ``shape``."""

    rows: tuple[int, ...]
    shape: tuple[int, ...]
    note: str


def _rms_norm_meta(
    match: NormMatch, weight: Node | torch.Tensor | None, view: _RowsView | None = None
) -> torch.Tensor | None:
    """The fake tensor the rebuilt norm produces for the match's input and weight (through ``view`` and back)."""
    x = tensor_meta(match.input)
    if x is None or detect_fake_mode([x]) is None:
        return None
    if view is None:
        return _rms_norm_value(x, match, weight)
    return _viewed(_rms_norm_value(_viewed(x, view.rows), match, weight), view.shape)


def _rms_norm_value(x: torch.Tensor, match: NormMatch, weight: Node | torch.Tensor | None) -> torch.Tensor:
    """The fake tensor ``aten.rms_norm`` produces for the fake input ``x`` and the match's weight."""
    mode = detect_fake_mode([x])
    w = tensor_meta(weight) if isinstance(weight, Node) else weight
    with mode:
        if isinstance(w, torch.Tensor) and not isinstance(w, torch._subclasses.FakeTensor):
            w = mode.from_tensor(w, static_shapes=True)
        return torch.ops.aten.rms_norm.default(x, list(match.normalized_shape), w, match.eps)


def _viewed(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The fake tensor a view of the fake tensor ``x`` in ``shape`` produces."""
    with detect_fake_mode([x]):
        return torch.ops.aten.view_copy.default(x, list(shape))


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


def _module_path(node: Node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    return path.removeprefix("L['self'].").removeprefix("L__self__.") or None


def _name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.")


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
            path = _module_path(mean)
            try:
                found = match_rms_norm(mean, table, GraphConstants(sub, None))
            except Exception as error:  # a malformed subgraph must not crash the pass either
                found = Rejection(mean, f"{UNREADABLE}: {error!r}")
            if isinstance(found, Rejection):
                decision = _rejected(found, path)
            else:
                m = found[0]
                decision = Decision(mean.name, path, m.form, False, reason, m.input.name,
                                    m.weight.node.name if m.weight else None, m.eps, m.dtype, m.normalized_shape)
            decisions.append(replace(decision, mean=qualified(decision.mean), input=qualified(decision.input),
                                     weight=qualified(decision.weight)))
        decisions += _nested_decisions(sub, f"{name}.", seen)
    return decisions


def _attribute(gm: GraphModule, target: str) -> object:
    value: object = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _rejected(rejection: Rejection, path: str | None) -> Decision:
    return Decision(
        rejection.mean.name,
        path,
        rejection.form,
        False,
        rejection.reason,
        rejection.input.name if rejection.input is not None else None,
        rejection.weight.name if rejection.weight is not None else None,
        rejection.eps,
    )
