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
* a rebuilt node must lie within ``ULPS`` units in the last place of its dtype of its twin, or be at
  least as accurate as its twin: against the norm computed in float64 from the rebuilt node's own input,
  weight and eps, no element further off than the twin's plus one unit in the last place. A norm that
  the model computes wholly in a half dtype rounds its square, mean, sum and inverse square root one by
  one, several units off the exact norm; the rebuilt node rounds once (rule 7 of
  :mod:`edgefuse.match` admits it because no tensor is narrower than the norm's dtype), so it may
  differ from its twin by more than ``ULPS`` while being the more accurate of the two;
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
from torch.fx import GraphModule, Interpreter, Node
from torch.utils import _pytree as pytree

from edgefuse.fuzz.tolerance import ULPS, compare_at
from edgefuse.ops import Role, table_for
from edgefuse.verify import Comparison, tolerance


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


def pair(original: GraphModule, rewritten: GraphModule, rebuilt: Mapping[str, str]) -> dict[str, str | None]:
    """For each rebuilt node (name -> name of the mean it was rebuilt from), its twin's name or None."""
    table = table_for(original.graph)
    skip = lambda node: table.is_a(node, Role.ASSERT_METADATA)  # noqa: E731
    kept = {n.name for n in rewritten.graph.nodes}
    by_name = {n.name: n for n in original.graph.nodes}
    by_name["__output__"] = next(n for n in original.graph.nodes if n.op == "output")
    new_nodes = {n.name: n for n in rewritten.graph.nodes}
    twins: dict[str, str | None] = {}
    for name, mean_name in rebuilt.items():
        new, mean = new_nodes.get(name), by_name.get(mean_name)
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


class _Recorder(Interpreter):
    """Runs a graph, recording some nodes' values and replacing others' with given ones."""

    def __init__(self, gm: GraphModule, record: set[str] = frozenset(), replace: Mapping[str, object] | None = None):
        super().__init__(gm)
        self.record, self.replace, self.values = record, dict(replace or {}), {}

    def run_node(self, node: Node):
        value = super().run_node(node)
        if node.name in self.record:
            self.values[node.name] = value
        return self.replace.get(node.name, value)


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
    #: Against the norm in float64: (rebuilt node's worst excess error over the twin's, one ulp), or None.
    accuracy: tuple[float, float] | None = None

    @property
    def ok(self) -> bool:
        if self.comparison is None:
            return False
        return self.comparison.ok or (self.accuracy is not None and self.accuracy[0] <= self.accuracy[1])

    def __str__(self) -> str:
        text = f"{self.node} against {self.twin}: {self.comparison}"
        if self.accuracy is not None:
            text += f"; against float64, at most {self.accuracy[0]:.3g} further off than the twin ({self.accuracy[1]:.3g} allowed)"
        return text


def _rms_norm_args(node: Node) -> tuple[object, object, object, object] | None:
    """The input, normalized shape, weight and eps of a rebuilt ``rms_norm`` node, or None."""
    args = list(node.args) + [None] * (4 - len(node.args))
    values = [node.kwargs.get(k, a) for k, a in zip(("input", "normalized_shape", "weight", "eps"), args[:4])]
    return tuple(values) if isinstance(values[0], Node) else None


def _exact(node: Node, values: Mapping[str, object], dtype: torch.dtype) -> torch.Tensor | None:
    """The rebuilt norm ``node`` computed in float64 from the values its graph gave it, or None."""
    args = _rms_norm_args(node)
    if args is None:
        return None
    x, shape, weight, eps = args
    x = values.get(x.name)
    w = values.get(weight.name) if isinstance(weight, Node) else weight
    if not isinstance(x, torch.Tensor) or not (w is None or isinstance(w, torch.Tensor)):
        return None
    eps = torch.finfo(dtype).eps if eps is None else float(eps)
    try:
        return torch.nn.functional.rms_norm(x.double(), list(shape), None if w is None else w.double(), eps)
    except (RuntimeError, TypeError, ValueError):
        return None


def _excess(value: torch.Tensor, twin: torch.Tensor, exact: torch.Tensor) -> tuple[float, float] | None:
    """How much further off ``exact`` the rebuilt ``value`` is than ``twin`` at worst, and one ulp of
    its dtype at the largest exact magnitude; None unless all three are finite and of one shape."""
    if not (value.shape == twin.shape == exact.shape):
        return None
    v, t = value.double(), twin.double()
    if not (torch.isfinite(v).all() and torch.isfinite(t).all() and torch.isfinite(exact).all()):
        return None
    excess = ((v - exact).abs() - (t - exact).abs()).max() if v.numel() else torch.tensor(0.0)
    return float(excess), tolerance(value.dtype, exact, 1.0)


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
    """Compare each paired rebuilt node with its twin, computed from the same values (see the module)."""
    with torch.no_grad():
        nodes = {n.name: n for n in rewritten.graph.nodes}
        operands = {
            a.name
            for name in twins
            if name in nodes and (args := _rms_norm_args(nodes[name])) is not None
            for a in (args[0], args[2])
            if isinstance(a, Node)
        }
        after = _Recorder(rewritten, record=set(twins) | operands)
        final = _tensors(after.run(*copy.deepcopy(tuple(inputs))))
        paired = {new: old for new, old in twins.items() if old is not None and new in after.values}
        before = _Recorder(
            original, record=set(paired.values()), replace={old: after.values[new] for new, old in paired.items()}
        )
        replayed = _tensors(before.run(*copy.deepcopy(tuple(inputs))))
    result = Replay()
    for new, old in twins.items():
        check = NormCheck(new, old if new in paired else None)
        value, reference = after.values.get(new), before.values.get(old) if old is not None else None
        if check.twin is not None and isinstance(value, torch.Tensor) and isinstance(reference, torch.Tensor):
            check.comparison = compare_at(reference, value, value.dtype, ulps)
            if not check.comparison.ok and new in nodes:
                exact = _exact(nodes[new], after.values, value.dtype)
                check.accuracy = _excess(value, reference, exact) if exact is not None else None
        result.norms[new] = check
    same_count = len(final) == len(replayed)
    result.exact = [same_count and _identical(a, b) for a, b in zip(final, replayed)] if same_count else [False] * len(final)
    return result
