"""Matchers for decomposed RMSNorm: each returns data, a list of matches or a rejection with a reason.

A norm is found from its ``mean``: the mean of a square, plus eps, through ``rsqrt`` (or ``sqrt`` and a
division or reciprocal; ``pow`` by -0.5 or 0.5 is the same root, and a cast that changes nothing may
follow it), times the tensor that was squared, then optional dtype-only casts, an optional weight and
trailing dtype-only casts. A match's label (its ``form``) comes from :mod:`edgefuse.core.forms`, the registry
the form tests and the fuzzer build their instances from. The rules, each with its reason:

1. The mean keeps its reduced dims and reduces exactly the trailing dims: that is what ``rms_norm``'s
   ``normalized_shape`` means.
2. The square is ``pow(x, 2)``, ``square(x)`` or ``x * x`` of one tensor (or of two casts of one tensor
   that change only its dtype, to one dtype, when the graph writes nothing of it in place: they hold the
   same values): a cube or a product of two tensors is another function.
3. The scaled tensor holds the squared tensor's values (the two may differ by casts that widen and change
   nothing else, as in T5, which squares a float32 copy, or be two such casts of one tensor as in rule 2):
   otherwise a rebuilt norm would drop one of them.
4. eps is a finite, non-negative number known when the program is built, taken as the model adds it:
   an eps too small for the dtype of the addition (1e-12 in float16) adds nothing there, so the norm is
   rebuilt with eps 0 and a zero row still gives NaN as in the model; one that overflows it stays.
   (Squares that underflow in such a norm are rule 7's caveat.)
5. Only dtype-only casts sit between the normalization and the weight multiply, the weight has exactly
   the normalized shape, and a scalar is never a weight: so a later ``* s`` is never taken as the weight.
6. The input is the nearest tensor of the output dtype among those holding the scaled values: the walk
   back passes only casts that keep every value, never a narrowing cast or a dim-order change.
7. Input and output share one dtype D and every tensor the norm computes is D or wider, and no wider
   than the precision ``rms_norm`` computes D in (float32 for the half dtypes, D itself otherwise): a
   rebuilt ``rms_norm`` reads and produces D and computes in that precision, so it must not drop a
   rounding below D, nor round where the model computed wider (a float32 norm computed in float64 has
   squares that do not overflow, and no float32 rounding at each step).
   Computing in a wider dtype may also remove an overflow or underflow that a norm computed wholly in
   float16 had (a square rounding to inf, or to 0 for values below about 2e-4): the rebuilt norm then
   returns the value float64 would, where the model returned inf, NaN or a value off by its rounding.
8. A grouped norm (the last dim split into groups, each normalized, then merged back, as in Mamba2) is
   rebuilt over one group, reading the split tensor, and ends before the merge: one ``rms_norm`` over the
   full width computes another function, and the full-width weight after the merge stays a multiply.
9. A norm whose output keeps a permuted layout (a QK norm after ``transpose(1, 2)``, as Gemma 3 and
   others write it) is rebuilt on the tensor the permutation reads, and the same permutation is applied
   to the rebuilt output, only where a norm rebuilt on its input would change the layout (``rms_norm``
   returns its own layout, not the transposed one, and later views and backend layout passes read the
   strides), and only when:
   a. the input is a transpose or permute view of a tensor, past casts that change nothing: the view
      holds that tensor's values, row for row; any other op between (a slice, a reshape, a cast that
      rounds or copies) keeps the norm decomposed. A cast that widens the view (a half model's float32
      norm, which QNN's one dtype asks for) keeps it too: the norm would read a new cast of the tensor
      before the view, which no quantization accounting of edgefuse follows yet (it compares a rebuilt
      norm with the decomposed one on the same input node);
   b. the permutation leaves every normalized dim where it is: a norm over the last dims commutes with
      any reordering of the others, while one that moves a normalized dim would have ``rms_norm``
      normalize another dim;
   c. the permuted output has exactly the shape and strides of the model's (the tensor the view reads
      may have a layout of its own, and symbolic strides must be provably equal).
   The rebuilt norm reads that tensor where the norm ends, as the view would be read there (a view
   shares its storage), so an in-place op inside the norm still keeps it decomposed. Only captured graphs
   hold such views: an edge graph copies (``permute_copy``) into a contiguous tensor, whose norm is
   rebuilt on it in its own layout, as before.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch.fx import Node

from edgefuse.core._fx import dtype_name
from edgefuse.core.casts import (
    at_least,
    cast_source,
    changes_only_dtype,
    dtype_of,
    exact_ancestors,
    is_noop_cast,
    same_shape,
    same_size,
    tensor_meta,
)
from edgefuse.core.constants import GraphConstants
from edgefuse.core.forms import label, root_label
from edgefuse.core.ops import OpTable, Role


@dataclass(frozen=True)
class Weight:
    """The tensor a norm multiplies by, and how it derives from a constant.

    ``chain`` lists the casts and scalar additions (Gemma's ``1 + w``) from ``root``, a constant node, to
    ``node``; ``root`` is None when the weight is computed from something other than a constant.
    """

    node: Node
    root: Node | None
    chain: tuple[Node, ...]


@dataclass(frozen=True)
class NormMatch:
    """A decomposed RMSNorm that ``rms_norm(input, normalized_shape, weight, eps)`` computes exactly.

    ``output`` is the node whose uses the rebuilt norm takes over; ``nodes`` are the matched nodes from
    the square to the output; ``dtype`` is D, the dtype of both input and output.
    """

    form: str
    mean: Node
    input: Node
    output: Node
    weight: Weight | None
    eps: float
    normalized_shape: tuple[int, ...]
    dtype: torch.dtype
    nodes: tuple[Node, ...]
    note: str | None = None


@dataclass(frozen=True)
class Rejection:
    """A mean that starts a norm-like chain which is not an RMSNorm to rebuild, and why."""

    mean: Node
    reason: str
    form: str = "unknown"
    nodes: tuple[Node, ...] = ()
    input: Node | None = None
    weight: Node | None = None
    eps: float | None = None


@dataclass(frozen=True)
class Failure:
    """Why one step of matching or rewriting does not apply, in words a person can read, and the node it
    is about: steps return it beside their result instead of raising, and the pass turns it into a reason."""

    reason: str
    source: Node | None = None


@dataclass(frozen=True)
class _Core:
    """The normalization ``h * rsqrt(mean(square(s)) + eps)`` before any cast or weight."""

    form: str
    square_base: Node
    scaled: Node
    normalized: Node
    eps: float
    normalized_shape: tuple[int, ...]
    nodes: tuple[Node, ...]
    note: str | None = None


def _single_user(node: Node, table: OpTable) -> Node | None:
    """The one node that uses ``node``, ignoring metadata assertions; None for zero or several users."""
    users = [u for u in node.users if not table.is_a(u, Role.ASSERT_METADATA)]
    return users[0] if len(users) == 1 else None


def _alpha(add: Node) -> object:
    """The ``alpha`` an addition scales its second operand by: keyword in ``add.Tensor``, positional in ``add.Scalar``."""
    return add.args[2] if len(add.args) > 2 else add.kwargs.get("alpha", 1)


def _other_operand(node: Node, operand: Node) -> object:
    """The argument of a binary op that is not ``operand`` (the second one when both are)."""
    a, b = node.args[0], node.args[1]
    return b if a is operand else a


def _value_key(node: Node, table: OpTable, constants: GraphConstants) -> object:
    """A key two nodes share when they provably hold the same values: the node itself, or for a cast
    that changes only the dtype, its source and dtype (two such casts of one tensor, as in
    ``x.half() * x.half()``, round alike), unless an in-place op may change that source, writing it or a
    tensor it views (then the two casts may read it before and after the write)."""
    source = cast_source(node, table)
    if source is not None and changes_only_dtype(node, table) and not constants.mutations.is_written(source):
        return ("cast", source, dtype_of(node))
    return node


def same_values(a: Node, b: Node, table: OpTable, constants: GraphConstants) -> bool:
    """Whether two tensors hold the same values: one is reached from the other by value-keeping casts,
    or both from one tensor by the same dtype-only cast."""
    keys = {_value_key(n, table, constants) for n in exact_ancestors(a, table)}
    return any(_value_key(n, table, constants) in keys for n in exact_ancestors(b, table))


def _square_base(node: Node, table: OpTable, constants: GraphConstants) -> Node | Failure:
    """The tensor a node squares, or the reason it is not a square."""
    role = table.role(node)
    if role is Role.SQUARE:
        return node.args[0]
    if role is Role.POW:
        exponent = _exponent(node, table, constants)
        if exponent == 2:
            return node.args[0]
        return Failure(f"the mean averages pow(x, {exponent!r}), not a square", node)
    if role is Role.MUL and len(node.args) == 2:
        a, b = node.args
        if isinstance(a, Node) and isinstance(b, Node) and same_values(a, b, table, constants):
            return a
        source = cast_source(a, table) if isinstance(a, Node) else None
        if source is not None and isinstance(b, Node) and cast_source(b, table) is source:
            differ = _how_casts_differ(a, b, source, constants)
            return Failure(f"the mean averages {node.name}, a product of {differ}, not a square", node)
        return Failure(f"the mean averages {node.name}, a product of two different tensors, not a square", node)
    return Failure(f"the mean averages {node.name}, which is not a square", node)


def _how_casts_differ(a: Node, b: Node, source: Node, constants: GraphConstants) -> str:
    """What makes two casts of ``source`` hold values that may differ, for a reason."""
    if dtype_of(a) != dtype_of(b):
        return f"casts of {source.name} to {dtype_name(dtype_of(a))} and to {dtype_name(dtype_of(b))}"
    if constants.mutations.is_written(source):
        return f"two casts of {source.name}, which the graph writes in place (they may read it before and after)"
    return f"two casts of {source.name} that change more than its dtype (its dim order or layout)"


def _mean_dims(mean: Node, value: torch.Tensor) -> list[int] | Failure:
    """The dims the mean reduces, non-negative and sorted, or why they are not usable."""
    dims = mean.args[1] if len(mean.args) > 1 else mean.kwargs.get("dim")
    keepdim = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    if not keepdim:
        return Failure("the mean drops the reduced dims (keepdim=False)", mean)
    dtype = mean.kwargs.get("dtype")
    if dtype is not None and dtype != value.dtype:
        reduces = f"while it reduces {dtype_name(value.dtype)} values"
        return Failure(f"the mean casts to {dtype_name(dtype)} {reduces}", mean)
    rank = value.dim()
    if rank == 0:
        return Failure("the mean reads a 0-d tensor: rms_norm normalizes at least one dim", mean)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    try:
        return sorted({d % rank for d in dims})
    except TypeError:
        return Failure(f"the mean's dims {dims!r} are not constant ints", mean)


def _eps(add: Node, mean: Node, table: OpTable, constants: GraphConstants) -> float | Failure:
    """The eps an addition adds to the mean, or why it is not a usable eps."""
    other = _other_operand(add, mean)
    if _alpha(add) != 1:
        return Failure("the eps addition scales its operand (alpha != 1)", add)
    if isinstance(other, Node) and other.op == "placeholder" and not constants.is_constant(other):
        kind = constants.source_kind(other)
        if kind is not None:
            what = "an input of the model" if kind == "user input" else kind
            return Failure(f"eps is the graph input {other.name}, {what}, not a constant", add)
        if constants.program is None and other.meta.get("val") is not None and other.meta["val"].dim() == 0:
            return Failure(
                f"eps is the graph input {other.name}, whose value edgefuse cannot read without its "
                "ExportedProgram (edge graphs lift eps into a constant: pass the program)",
                add,
            )
        return Failure(f"eps is the graph input {other.name}, not a constant", add)
    eps = constants.scalar(other, table)
    if eps is None:
        return Failure(f"eps ({getattr(other, 'name', other)!r}) is not a constant number", add)
    if not math.isfinite(eps) or eps < 0:
        return Failure(f"eps is {eps!r}; rms_norm needs a finite, non-negative eps", add)
    return eps


def _eps_as_added(eps: float, dtype: torch.dtype | None) -> tuple[float, str | None] | Failure:
    """eps as an addition in ``dtype`` applies it, with a note when that differs from the written value.

    The sum is rounded to ``dtype``: an eps that rounds to zero there adds nothing to any mean (0 on a zero
    row stays 0), while one that rounds to inf makes every sum inf.
    """
    if dtype is None or not dtype.is_floating_point or eps == 0:
        return eps, None
    added = _rounded(eps, dtype)
    if not math.isfinite(added):
        return Failure(f"eps {eps!r} overflows {dtype_name(dtype)}, the dtype the model adds it in", None)
    if added == 0:
        return 0.0, f"eps {eps!r} is 0 in {dtype_name(dtype)}, where the model adds it: rebuilt with eps 0"
    return eps, None


@functools.lru_cache(maxsize=1024)
def _rounded(eps: float, dtype: torch.dtype) -> float:
    """``eps`` rounded to ``dtype``; kept, as a model adds one eps in one dtype norm after norm."""
    return torch.tensor(eps, dtype=torch.float64).to(dtype).item()


def _match_core(mean: Node, table: OpTable, constants: GraphConstants) -> _Core | Rejection:
    """Rules 1 to 4: the normalization itself, up to the multiply by the scaled tensor."""
    squared = mean.args[0] if mean.args else None
    if not isinstance(squared, Node):
        return Rejection(mean, "the mean reads no tensor node")
    value = tensor_meta(squared)
    if value is None:
        return Rejection(mean, f"{squared.name} has no tensor metadata (meta['val']); edgefuse reads dtypes from it")
    base = _square_base(squared, table, constants)
    if isinstance(base, Failure):
        return Rejection(mean, base.reason, nodes=(squared, mean))
    dims = _mean_dims(mean, value)
    if isinstance(dims, Failure):
        return Rejection(mean, dims.reason, nodes=(squared, mean))
    rank = value.dim()
    if dims != list(range(rank - len(dims), rank)):
        return Rejection(
            mean, f"the mean reduces dims {dims} of a rank-{rank} tensor, not the trailing dims", nodes=(squared, mean)
        )
    shape = tuple(value.shape[d] for d in dims)
    if not all(isinstance(s, int) for s in shape):
        return Rejection(mean, f"the normalized shape {list(shape)} is symbolic", nodes=(squared, mean))

    nodes = [squared, mean]
    step = _single_user(mean, table)
    eps, note = 0.0, None
    if step is not None and table.is_a(step, Role.ADD):
        written = _eps(step, mean, table, constants)
        added = written if isinstance(written, Failure) else _eps_as_added(written, dtype_of(step))
        if isinstance(added, Failure):
            return Rejection(mean, added.reason, nodes=tuple(nodes))
        eps, note = added
        nodes.append(step)
        step = _single_user(step, table)
    if step is None:
        used = f"the mean of squares plus eps ({nodes[-1].name})" if len(nodes) > 2 else "the mean of squares"
        return Rejection(mean, f"{used} is used by more than one node or by none", nodes=tuple(nodes))

    inverse = _inverse(step, table, constants)
    if isinstance(inverse, Failure):
        return Rejection(mean, inverse.reason, nodes=tuple(nodes), eps=eps)
    form, inverse_nodes, scaled = inverse
    nodes.extend(inverse_nodes)
    normalized = inverse_nodes[-1]
    if not isinstance(scaled, Node):
        return Rejection(mean, f"{normalized.name} scales a constant, not a tensor", form, tuple(nodes), eps=eps)
    if not same_values(scaled, base, table, constants):
        return Rejection(
            mean,
            f"it scales {scaled.name} but squares {base.name}: the norm of one tensor scales the tensor it squares",
            form,
            tuple(nodes),
            eps=eps,
        )
    return _Core(form, base, scaled, normalized, eps, shape, tuple(nodes), note)


def _exponent(node: Node, table: OpTable, constants: GraphConstants) -> object:
    """The exponent of a ``pow``: a Python number, or the value of a 0-dim constant tensor (QNN's export
    passes lift scalar operands into constants, so ``pow(x, 2)`` reaches an edge graph as
    ``pow.Tensor_Tensor`` of a lifted 2); anything else by the name of the node that holds it."""
    exponent = node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")
    if isinstance(exponent, bool):
        return exponent
    if isinstance(exponent, Node):  # only a 0-dim tensor broadcasts and promotes as a Python number does
        held = tensor_meta(exponent)
        value = constants.scalar(exponent, table) if held is not None and held.dim() == 0 else None
        return exponent.name if value is None else value
    return exponent


def _root(node: Node, table: OpTable, constants: GraphConstants) -> tuple[Role, bool, str] | None:
    """(RSQRT or SQRT, whether it is written as a pow, the root as a reason names it) for ``rsqrt`` and
    ``sqrt``, and for ``pow(m, -0.5)`` and ``pow(m, 0.5)`` (Gemma 3n and 4 write the root so): the same
    function, rounded once to the same dtype."""
    role = table.role(node)
    if role in (Role.RSQRT, Role.SQRT):
        return role, False, role.value
    if role is Role.POW:
        exponent = _exponent(node, table, constants)
        if isinstance(exponent, float) and exponent in (-0.5, 0.5):
            root = Role.RSQRT if exponent < 0 else Role.SQRT
            return root, True, f"{root.value} {node.name} (a pow by {exponent})"
    return None


def _past_identity_casts(node: Node, table: OpTable) -> tuple[list[Node], Node | None]:
    """The casts that follow ``node`` and change nothing (a float32 model's ``.to(x.dtype)``, which a
    captured graph keeps), and the single user after them."""
    skipped = list(itertools.takewhile(lambda cast: is_noop_cast(cast, table), _forward_casts(node, table)))
    return skipped, _single_user(skipped[-1] if skipped else node, table)


def _inverse(step: Node, table: OpTable, constants: GraphConstants) -> tuple[str, list[Node], object] | Failure:
    """(form, nodes up to the normalization, scaled tensor) from the node after ``mean + eps``, or a reason;
    the form is the root's label in :data:`edgefuse.core.forms.ROOTS`."""
    root = _root(step, table, constants)
    if root is None:
        return Failure(f"{step.name} follows the mean of squares, not rsqrt, sqrt, or pow by -0.5 or 0.5", step)
    role, by_pow, what = root
    identities, user = _past_identity_casts(step, table)
    last = identities[-1] if identities else step
    if user is None:
        return Failure(
            f"the {last.name} is used by {len(last.users)} nodes: a rebuilt norm would hide it from the others", step
        )
    if role is Role.RSQRT:
        if table.is_a(user, Role.MUL) and last in user.args[:2]:
            return root_label(role.value, by_pow, "mul"), [step, *identities, user], _other_operand(user, last)
        if table.is_a(user, Role.CAST):
            return Failure(
                f"the {what} is cast ({user.name}) before it scales a tensor; edgefuse takes an rsqrt that "
                "scales one",
                step,
            )
        return Failure(f"the {what} does not scale a tensor", step)
    if table.is_a(user, Role.DIV) and len(user.args) == 2 and user.args[1] is last:
        return root_label(role.value, by_pow, "div"), [step, *identities, user], user.args[0]
    if table.is_a(user, Role.RECIPROCAL):
        mul = _single_user(user, table)
        if mul is not None and table.is_a(mul, Role.MUL) and user in mul.args[:2]:
            form = root_label(role.value, by_pow, "reciprocal")
            return form, [step, *identities, user, mul], _other_operand(mul, user)
    return Failure(f"the {what} does not divide a tensor", step)


def _forward_casts(node: Node, table: OpTable) -> list[Node]:
    """The dtype-only casts that follow ``node`` one after another, each its predecessor's only user."""
    casts = []
    while (user := _single_user(node, table)) is not None and cast_source(user, table) is node and changes_only_dtype(user, table):
        casts.append(user)
        node = user
    return casts


def _scalar_addend(add: Node, table: OpTable, constants: GraphConstants) -> Node | None:
    """The tensor operand of ``tensor + scalar`` (either order), or None for any other addition."""
    if len(add.args) != 2 or _alpha(add) != 1:
        return None
    for tensor, scalar in (add.args, reversed(add.args)):
        meta = tensor_meta(scalar)
        if isinstance(tensor, Node) and constants.scalar(scalar, table) is not None and (meta is None or meta.dim() == 0):
            return tensor
    return None


def _weight_chain(node: object, table: OpTable, constants: GraphConstants) -> tuple[Node | None, tuple[Node, ...]]:
    """The constant behind a weight and the casts and scalar additions from it, or (None, ()) if none."""
    chain: list[Node] = []
    while isinstance(node, Node):
        if constants.is_constant(node):
            return node, tuple(reversed(chain))
        previous = cast_source(node, table)
        if previous is None and table.is_a(node, Role.ADD):
            previous = _scalar_addend(node, table, constants)
        if previous is None:
            break
        chain.append(node)
        node = previous
    return None, ()


def _weight(mul: Node, operand: Node, shape: tuple[int, ...], table: OpTable, constants: GraphConstants) -> Weight | None:
    """The weight a multiply applies, or None when its other operand is not a weight of the normalized shape."""
    if len(mul.args) != 2:
        return None
    other = _other_operand(mul, operand)
    if other is operand:
        return None
    value = tensor_meta(other)
    if value is None or tuple(value.shape) != shape:
        return None
    root, chain = _weight_chain(other, table, constants)
    return Weight(other, root, chain)


def _group_merge(core: _Core, after: Node | None, table: OpTable) -> bool:
    """Rule 8: whether the input was split from a wider last dim and ``after`` merges it back (a grouped norm)."""
    if after is None or not table.is_a(after, Role.RESHAPE):
        return False
    splits = [list(exact_ancestors(start, table))[-1] for start in (core.scaled, core.square_base)]
    split = next((n for n in splits if table.is_a(n, Role.RESHAPE)), None)
    source = tensor_meta(split.args[0]) if split is not None and isinstance(split.args[0], Node) else None
    merged = tensor_meta(after)
    if source is None or merged is None or source.dim() == 0 or merged.dim() == 0:
        return False
    width, size = merged.shape[-1], core.normalized_shape[-1]
    return isinstance(width, int) and width > size and same_size(source.shape[-1], width)


def _input_of(dtype: torch.dtype, core: _Core, table: OpTable) -> Node | None:
    """Rule 6: the nearest tensor of ``dtype`` holding the scaled values, the scaled side first."""
    for start in (core.scaled, core.square_base):
        for node in exact_ancestors(start, table):
            if dtype_of(node) == dtype:
                return node
    return None


@dataclass(frozen=True)
class Permuted:
    """Rule 9: a norm's input is ``permute`` (a view that reorders dims) of ``base``, past casts that change
    nothing."""

    permute: Node
    base: Node


def permutation(node: Node) -> tuple[int, ...] | None:
    """The dims of its input that each output dim of a permuting view is (``transpose(1, 2)`` of a rank-4
    tensor: ``(0, 2, 1, 3)``), read by applying the op to a meta tensor of distinct sizes; None when the
    node has no input metadata or the op cannot be applied."""
    value = tensor_meta(node.args[0]) if node.args else None
    if value is None:
        return None
    try:
        probe = torch.empty(tuple(range(2, value.dim() + 2)), device="meta")
        out = node.target(probe, *node.args[1:], **node.kwargs)
    except Exception:  # arguments edgefuse cannot replay leave the norm alone
        return None
    return tuple(size - 2 for size in out.shape)


def permuted_input(match: NormMatch, table: OpTable) -> Permuted | Failure:
    """Rule 9 (a, b): the permuted view a norm's input is, and the tensor it reads, or why there is none."""
    node = match.input
    while is_noop_cast(node, table):
        node = cast_source(node, table)
    *_, widened = exact_ancestors(node, table)
    if widened is not node and table.is_a(widened, Role.PERMUTE):
        return Failure(
            f"its input {node.name} is a {dtype_name(dtype_of(node))} copy of the permuted view "
            f"{widened.name}: edgefuse rebuilds a norm before a permutation only in the view's own dtype",
            node,
        )
    if not table.is_a(node, Role.PERMUTE) or not isinstance(node.args[0], Node):
        return Failure(
            f"its input {match.input.name} is no transpose or permute of a tensor (past casts that change "
            "nothing) that the norm could be rebuilt on",
            node,
        )
    order = permutation(node)
    if order is None:
        return Failure(f"edgefuse could not read the permutation {node.name} applies", node)
    rank = len(order)
    moved = [d for d in range(rank - len(match.normalized_shape), rank) if order[d] != d]
    if moved:
        return Failure(
            f"{node.name} puts dim {order[moved[0]]} of {node.args[0].name} at dim {moved[0]}, which the norm "
            "normalizes: rebuilt before the permutation, rms_norm would normalize another dim",
            node,
        )
    return Permuted(node, node.args[0])


def rms_norm_precision(dtype: torch.dtype) -> torch.dtype:
    """The dtype ``aten.rms_norm`` computes a norm of ``dtype`` in: float32 for the half dtypes, else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _rounding_reason(computed: Sequence[Node], dtype: torch.dtype) -> str | None:
    """Rule 7: the first computed tensor narrower than the norm dtype, or wider than the precision a
    rebuilt ``rms_norm`` computes in, as a reason; None when there is none."""
    widest = rms_norm_precision(dtype)
    for node in computed:
        node_dtype = dtype_of(node)
        if node_dtype is None:
            return f"{node.name} has no tensor metadata (meta['val'])"
        if not at_least(node_dtype, dtype):
            return (
                f"{node.name} rounds to {dtype_name(node_dtype)} inside a {dtype_name(dtype)} norm; "
                "a rebuilt rms_norm would drop that rounding"
            )
        if node_dtype.is_floating_point and not at_least(widest, node_dtype):
            return (
                f"{node.name} computes in {dtype_name(node_dtype)} inside a {dtype_name(dtype)} norm, which a "
                f"rebuilt rms_norm computes in {dtype_name(widest)}: it would add roundings the model does not make"
            )
    return None


def match_rms_norm(mean: Node, table: OpTable, constants: GraphConstants) -> list[NormMatch] | Rejection:
    """The ways to rebuild the norm that starts at ``mean``, longest first, or why there is none.

    Several matches differ only in where the norm ends: after the weight and every trailing cast, or
    before some of those casts. Each one computes exactly what the matched nodes compute.
    """
    core = _match_core(mean, table, constants)
    if isinstance(core, Rejection):
        return core

    middle = _forward_casts(core.normalized, table)
    last = middle[-1] if middle else core.normalized
    after = _single_user(last, table)
    grouped = _group_merge(core, after, table)  # rule 8: then ``after`` is the merge, never a weight
    weight = None
    if after is not None and table.is_a(after, Role.MUL):
        weight = _weight(after, last, core.normalized_shape, table, constants)
    if weight is not None:
        body = [*core.nodes, *middle, after]
        ends = [after, *_forward_casts(after, table)]
    else:
        body = list(core.nodes)
        ends = [core.normalized, *middle]

    reasons = []
    matches = []
    for i in reversed(range(len(ends))):
        end = ends[i]
        computed = [*body, *ends[1 : i + 1]]
        dtype = dtype_of(end)
        if dtype is None or not dtype.is_floating_point:
            reasons.append(f"{end.name} has no float tensor metadata")
            continue
        source = _input_of(dtype, core, table)
        if source is None:
            have = sorted({dtype_name(dtype_of(n)) for n in exact_ancestors(core.scaled, table)})
            reasons.append(
                f"it produces {dtype_name(dtype)} from {'/'.join(have)} values: rms_norm produces its input's "
                "dtype, and no tensor of the output dtype holds the input"
            )
            continue
        reason = _rounding_reason(computed, dtype)
        in_meta, out_meta = tensor_meta(source), tensor_meta(end)
        if reason is None and not same_shape(in_meta, out_meta):
            reason = f"the output shape of {end.name} differs from the input's"
        trailing = tuple(in_meta.shape[in_meta.dim() - len(core.normalized_shape) :]) if reason is None else ()
        if reason is None and (in_meta.dim() < len(core.normalized_shape) or trailing != core.normalized_shape):
            reason = (
                f"the mean normalizes {list(core.normalized_shape)} but the input {source.name} ends in "
                f"{list(trailing)}: the graph's metadata disagrees with itself"
            )
        if reason is not None:
            reasons.append(reason)
            continue
        matches.append(
            NormMatch(
                form=label(core.form, grouped, weight is not None),
                mean=mean,
                input=source,
                output=end,
                weight=weight,
                eps=core.eps,
                normalized_shape=core.normalized_shape,
                dtype=dtype,
                nodes=tuple(dict.fromkeys([*body, *(weight.chain if weight else ()), *ends[: i + 1]])),
                note=core.note,
            )
        )
    if matches:
        return matches
    return Rejection(
        mean,
        reasons[0],
        label(core.form, grouped, False),
        tuple(dict.fromkeys([*body, *ends])),
        input=None,
        weight=weight.node if weight is not None else None,
        eps=core.eps,
    )
