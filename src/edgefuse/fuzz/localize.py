"""Norm by norm: each rebuilt ``rms_norm`` against the decomposed norm it replaced, on the same inputs.

Comparing outputs with eager sees a rewrite only through what follows the norm. A later rounding can hide
a dropped one (a float32 norm that rounds to bfloat16 inside, rebuilt without that rounding, then rounded
to bfloat16 anyway), and an ill-conditioned op after the norm (a cube, or a mean near zero under rsqrt)
can magnify a difference the pass is allowed to make far beyond any output tolerance. This module checks
the rewrite where it happens:

* :func:`pair` finds each rebuilt node's *twin*: the node of the original graph whose uses it took over,
  the last node, in the rebuilt node's dtype and shape, of the chain of single users that starts at the
  norm's mean; the twin's and the rebuilt node's users must agree where both graphs have them;
* :func:`replay` runs the rewritten graph, then the original graph with each twin's value replaced by
  its rebuilt node's value, recording what each twin computes there: each decomposed norm is computed
  from exactly the values its rebuilt node read, even behind another rebuilt norm;
* a rebuilt node must lie within ``ULPS`` units in the last place of its dtype D of its twin, with one
  exception. A norm that the model computes wholly in D (every tensor between its input and its twin D
  or wider) rounds its square, mean, sum and inverse square root to D one by one and may end several
  units off the exact norm; the rebuilt node rounds once (rule 7 of :mod:`edgefuse.core.match` admits it),
  so it may differ from its twin by more than ``ULPS`` while being the better answer. Such a node
  passes when it lies within one unit of D of the *model's own* norm computed exactly: the original
  graph's nodes from the norm's input to the twin, evaluated in float64 with every cast between them
  kept exact, on the same input values. That reference owes nothing to the rebuilt node's arguments,
  so a wrong input, weight or eps still fails, and a norm that rounds below D is never excused;
* an output difference is the model's own magnification of allowed differences only when every
  rebuilt norm upstream has a twin and lies within its tolerance, and the original graph fed the
  rebuilt values gives the rewritten output bit for bit, so that nothing else computes differently
  (:meth:`Replay.explains`).

A rebuilt node without a twin (an unusual graph) is counted as *unpaired*: it is then judged at the
outputs alone, and never explains a difference there.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
from torch.fx import GraphModule, Node
from torch.utils import _pytree as pytree

from edgefuse.core._fx import Recorder
from edgefuse.fuzz.tolerance import ULPS, compare_at
from edgefuse.core.ops import Role, table_for
from edgefuse.core.paths import nodes_between
from edgefuse.core.verify import Comparison, tolerance


def _meta(node: Node) -> torch.Tensor | None:
    value = node.meta.get("val")
    return value if isinstance(value, torch.Tensor) else None


def _chain(mean: Node, kept: set[str], skip) -> list[Node]:
    """The nodes after ``mean`` along single users that the rewrite erased."""
    chain, node = [], mean
    while True:
        users = [u for u in node.users if not skip(u)]
        if len(users) != 1 or users[0].op == "output" or users[0].name in kept:
            return chain
        node = users[0]
        chain.append(node)


def _flat_args(node: Node) -> list:
    return pytree.tree_leaves([list(node.args), dict(node.kwargs)])


def _users_agree(new: Node, twin: Node, original: dict[str, Node]) -> bool:
    """Whether every user of ``new`` that the original graph also has reads ``twin`` where it reads ``new``."""
    for user in new.users:
        mirror = original.get(user.name) if user.op != "output" else original.get("__output__")
        if mirror is None:
            continue  # a node the rewrite added (another rebuilt norm)
        mine, theirs = _flat_args(user), _flat_args(mirror)
        if len(mine) != len(theirs):
            return False
        if any(a is new and b is not twin for a, b in zip(mine, theirs)):
            return False
    return True


def _added(node: Node, original_names: set[str]) -> bool:
    """Whether the rewrite added ``node``: the rewritten graph keeps the names of the nodes it kept, and
    names a new node with a name no node of the original graph had."""
    return node.name not in original_names


def _replacement(new: Node, original_names: set[str]) -> Node:
    """The node that took over the uses of the norm ``new`` was rebuilt from: ``new`` itself, or the last
    of the views and the permutation the rewrite put after it (the view back in the input's shape of a
    norm rebuilt on a ``[1, rows, D]`` view for a backend's limit; rule 9's permutation)."""
    table = table_for(new.graph)
    node = new
    while len(node.users) == 1:
        (user,) = node.users
        reshapes = table.is_a(user, Role.RESHAPE) or table.is_a(user, Role.PERMUTE)
        if not reshapes or not _added(user, original_names) or user.args[0] is not node:
            break
        if any(table.is_a(u, Role.RMS_NORM) for u in user.users):  # the next rebuilt norm's rows view
            break
        node = user
    return node


def _norm_read(new: Node, original_names: set[str]) -> Node | None:
    """The tensor of the original graph a rebuilt ``rms_norm`` normalizes: its input, or the tensor its
    input views when the rewrite added that view."""
    read = new.args[0] if new.args and isinstance(new.args[0], Node) else None
    if read is not None and _added(read, original_names) and table_for(new.graph).is_a(read, Role.RESHAPE):
        read = read.args[0] if isinstance(read.args[0], Node) else None
    return read


def pair(original: GraphModule, rewritten: GraphModule, rebuilt: Mapping[str, str]) -> dict[str, str | None]:
    """For each rebuilt node (name -> name of the mean it was rebuilt from), its twin's name or None: the
    twin is compared with the node that took the twin's uses over (:func:`_replacement`)."""
    table = table_for(original.graph)
    skip = lambda node: table.is_a(node, Role.ASSERT_METADATA)  # noqa: E731
    kept = {n.name for n in rewritten.graph.nodes}
    by_name = {n.name: n for n in original.graph.nodes}
    by_name["__output__"] = next(n for n in original.graph.nodes if n.op == "output")
    new_nodes = {n.name: n for n in rewritten.graph.nodes}
    twins: dict[str, str | None] = {}
    for name, mean_name in rebuilt.items():
        new, mean = new_nodes.get(name), by_name.get(mean_name)
        new = _replacement(new, set(by_name)) if new is not None else None
        value = _meta(new) if new is not None else None
        twin = None
        if value is not None and mean is not None and mean.name not in kept:
            for node in reversed(_chain(mean, kept, skip)):
                other = _meta(node)
                if other is not None and other.dtype == value.dtype and tuple(other.shape) == tuple(value.shape):
                    twin = node
                    break
        twins[name] = twin.name if twin is not None and _users_agree(new, twin, by_name) else None
    return twins


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit the same values (NaN where the other has NaN), dtype and shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan_a, nan_b = a.isnan(), b.isnan()
    return torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b])


@dataclass
class NormCheck:
    """One rebuilt node: its twin (None: unpaired) and how its value compares with the twin's."""

    node: str
    twin: str | None
    comparison: Comparison | None = None
    #: Norm computed wholly in D and the twin misses: (rebuilt node's error against the model's own norm
    #: computed exactly, one ulp of D at its largest value), or None when that exception does not apply.
    exact: tuple[float, float] | None = None

    @property
    def ok(self) -> bool:
        if self.comparison is None:
            return False
        return self.comparison.ok or (self.exact is not None and self.exact[0] <= self.exact[1])

    def __str__(self) -> str:
        text = f"{self.node} against {self.twin}: {self.comparison}"
        if self.exact is not None:
            text += f"; against the model's norm computed exactly: {self.exact[0]:.3g} ({self.exact[1]:.3g} allowed)"
        return text


def _exact_twin(original: GraphModule, input_name: str, twin_name: str, values: Mapping[str, object],
                dtype: torch.dtype) -> torch.Tensor | None:
    """The model's own norm, the nodes from ``input_name`` to ``twin_name``, computed in float64 with
    every cast between them exact, from the values the original graph gave it; None when the norm
    computes any tensor narrower than ``dtype`` or cannot be evaluated so."""
    from edgefuse.core.casts import cast_source, is_exact

    nodes = {n.name: n for n in original.graph.nodes}
    source, twin = nodes.get(input_name), nodes.get(twin_name)
    chain = nodes_between(source, twin) if source is not None and twin is not None else []
    if not chain:
        return None
    table = table_for(original.graph)
    exact: dict[Node, object] = {}

    def wide(value):
        return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    def arg(a):
        if isinstance(a, Node):
            return exact[a] if a in exact else wide(values.get(a.name))
        return a

    try:
        exact[source] = wide(values[source.name])
        for node in chain:
            value = values.get(node.name)
            if not isinstance(value, torch.Tensor) or not value.is_floating_point() or not is_exact(dtype, value.dtype):
                return None  # a tensor narrower than the norm's dtype: no exception for this norm
            read = cast_source(node, table)
            if read is not None:
                exact[node] = arg(read)
                continue
            exact[node] = node.target(*pytree.tree_map(arg, node.args), **pytree.tree_map(arg, node.kwargs))
        result = exact[twin]
    except Exception:  # noqa: BLE001  (an op that will not run in float64: no exception, the twin decides)
        return None
    return result if isinstance(result, torch.Tensor) and result.dtype == torch.float64 else None


def _error_against(value: torch.Tensor, exact: torch.Tensor) -> tuple[float, float] | None:
    """The largest error of ``value`` against ``exact``, and one ulp of its dtype at the largest exact
    value; None unless both are finite and of one shape."""
    if value.shape != exact.shape or not (torch.isfinite(value).all() and torch.isfinite(exact).all()):
        return None
    error = float((value.double() - exact).abs().max()) if value.numel() else 0.0
    return error, tolerance(value.dtype, exact, 1.0)


@dataclass
class Replay:
    """The rebuilt norms of one rewritten graph, one by one, and whether the rest computes as before."""

    norms: dict[str, NormCheck] = field(default_factory=dict)
    exact: list[bool] = field(default_factory=list)  # per output

    def explains(self, output: int, nodes: set[str]) -> str | None:
        """Why a difference at ``output`` is ``nodes``' allowed difference magnified by the model, or None."""
        checks = [self.norms.get(n) for n in sorted(nodes)]
        if not checks or not all(c is not None and c.ok for c in checks):
            return None
        if output >= len(self.exact) or not self.exact[output]:
            return None
        notes = "; ".join(
            f"{c.node} within {c.comparison.max_error:.3g} of {c.twin} ({c.comparison.allowed:.3g} allowed)" for c in checks
        )
        return notes + "; the original graph fed those values gives the rewritten output bit for bit"


def replay(
    original: GraphModule, rewritten: GraphModule, twins: Mapping[str, str | None], inputs: Sequence, ulps: float = ULPS
) -> Replay:
    """Compare each paired rebuilt node with its twin, computed from the same values (see the module):
    the value compared is that of the node that took the twin's uses over (:func:`_replacement`)."""
    original_names = {n.name for n in original.graph.nodes}
    rewritten_nodes = {n.name: n for n in rewritten.graph.nodes}
    out = {new: _replacement(rewritten_nodes[new], original_names).name for new in twins if new in rewritten_nodes}
    inputs_read = {new: _norm_read(rewritten_nodes[new], original_names) for new in out}
    inputs_read = {new: read.name for new, read in inputs_read.items() if read is not None}
    with torch.no_grad():
        after = Recorder(rewritten, record=set(out.values()))
        final = _tensors(after.run(*copy.deepcopy(tuple(inputs))))
        paired = {new: old for new, old in twins.items() if old is not None and out.get(new) in after.values}
        before = Recorder(
            original, record=original_names,
            replace={old: after.values[out[new]] for new, old in paired.items()},
        )
        replayed = _tensors(before.run(*copy.deepcopy(tuple(inputs))))
    result = Replay()
    for new, old in twins.items():
        check = NormCheck(new, old if new in paired else None)
        value = after.values.get(out[new]) if new in out else None
        reference = before.values.get(old) if old is not None else None
        if check.twin is not None and isinstance(value, torch.Tensor) and isinstance(reference, torch.Tensor):
            check.comparison = compare_at(reference, value, value.dtype, ulps)
            read = inputs_read.get(new)
            if not check.comparison.ok and read is not None:
                exact = _exact_twin(original, read, old, before.values, value.dtype)
                check.exact = _error_against(value, exact) if exact is not None else None
        result.norms[new] = check
    same_count = len(final) == len(replayed)
    result.exact = [same_count and _identical(a, b) for a, b in zip(final, replayed)] if same_count else [False] * len(final)
    return result


def norm_by_norm(original: GraphModule, rewritten: GraphModule, rebuilt: Mapping[str, str], inputs: Sequence) -> Replay | None:
    """Each rebuilt node (name -> name of the mean it was rebuilt from) compared with the decomposed norm it
    replaced (:func:`pair`, then :func:`replay`); None when nothing was rebuilt or the graphs cannot be
    interpreted, and every rebuilt norm is then judged at the outputs alone."""
    if not rebuilt:
        return None
    try:
        return replay(original, rewritten, pair(original, rewritten, rebuilt), inputs)
    except Exception:  # noqa: BLE001  (a graph the interpreter cannot run)
        return None
