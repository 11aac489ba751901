"""Cast semantics: which nodes are casts, what they change, and whether they round.

Everything here reads the tensor metadata export leaves on each node (``meta["val"]``), never the cast's
keyword arguments: ``to.dtype`` passes its memory format positionally, ``_to_copy`` by keyword and
``_to_dim_order_copy`` as a dim order, but all of them leave the same metadata behind.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch
from torch.fx import Node

from edgefuse.core.ops import OpTable, Role

#: Pairs (source, destination) of float dtypes where every source value is exactly a destination value.
_WIDENING = frozenset(
    {
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float64),
        (torch.bfloat16, torch.float64),
        (torch.float32, torch.float64),
    }
)


def tensor_meta(node: object) -> torch.Tensor | None:
    """The fake tensor export recorded for a node, or None when it has none."""
    if not isinstance(node, Node):
        return None
    value = node.meta.get("val")
    return value if isinstance(value, torch.Tensor) else None


def dtype_of(node: object) -> torch.dtype | None:
    """The dtype a node produces, or None when its metadata is missing."""
    value = tensor_meta(node)
    return value.dtype if value is not None else None


def is_exact(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether casting ``src`` to ``dst`` keeps every value: the same dtype, or a wider float.

    float16 and bfloat16 are both narrower than float32, and neither is wider than the other.
    """
    return src == dst or (src, dst) in _WIDENING


def at_least(dtype: torch.dtype, floor: torch.dtype) -> bool:
    """Whether values of ``dtype`` hold every value of ``floor`` (``dtype`` is ``floor`` or wider)."""
    return is_exact(floor, dtype)


def same_size(a: object, b: object) -> bool:
    """Whether two sizes are provably equal: equal ints, or one symbolic expression."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return a.node.expr == b.node.expr
    return False


def same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two fake tensors provably have one shape."""
    if len(a.shape) != len(b.shape):
        return False
    if are_ints(a.shape) and are_ints(b.shape):
        return tuple(a.shape) == tuple(b.shape)
    return all(same_size(x, y) for x, y in zip(a.shape, b.shape))


def are_ints(values: Iterable[object]) -> bool:
    """Whether every value is a plain int (no SymInt, which comparing would guard on)."""
    return set(map(type, values)) <= {int}


def dim_order_of(value: torch.Tensor) -> tuple[int, ...] | None:
    try:
        return tuple(value.dim_order())
    except Exception:  # ambiguous strides (size-1 dims) or symbolic strides
        return None


def _same_sizes_and_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two strided tensors have equal int sizes and strides: then they have one dim order, known
    without computing it (``dim_order`` is the costly part of reading a cast, and a pure function of both)."""
    if not a.layout == b.layout == torch.strided:
        return False
    sizes = (*a.shape, *a.stride(), *b.shape, *b.stride())  # compared only once known to be ints: no guards
    return are_ints(sizes) and tuple(a.shape) == tuple(b.shape) and a.stride() == b.stride()


def same_dim_order(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``dim_order_of`` gives two tensors one answer (both unknown counts as one)."""
    return _same_sizes_and_strides(a, b) or dim_order_of(a) == dim_order_of(b)


def is_cast(node: Node, table: OpTable) -> bool:
    """Whether the node is one of the dialect's casts."""
    return table.is_a(node, Role.CAST)


def cast_source(node: Node, table: OpTable) -> Node | None:
    """The tensor a cast reads, or None when the node is not a cast."""
    if not is_cast(node, table) or not node.args or not isinstance(node.args[0], Node):
        return None
    return node.args[0]


def changes_only_dtype(node: Node, table: OpTable) -> bool:
    """Whether a cast keeps its input's shape, layout, device and dim order, changing at most the dtype."""
    source = cast_source(node, table)
    if source is None:
        return False
    src, out = tensor_meta(source), tensor_meta(node)
    if src is None or out is None:
        return False
    if not same_shape(src, out) or src.layout != out.layout or src.device != out.device:
        return False
    if _same_sizes_and_strides(src, out):
        return True
    src_order = dim_order_of(src)
    return src_order is not None and src_order == dim_order_of(out)


def is_exact_cast(node: Node, table: OpTable) -> bool:
    """Whether the node is a dtype-only cast that keeps every value (to the same or a wider dtype)."""
    if not changes_only_dtype(node, table):
        return False
    return is_exact(dtype_of(cast_source(node, table)), dtype_of(node))


def is_noop_cast(node: Node, table: OpTable) -> bool:
    """Whether a cast changes nothing at all: same dtype, shape, layout, device and dim order."""
    return changes_only_dtype(node, table) and dtype_of(cast_source(node, table)) == dtype_of(node)


def exact_ancestors(node: Node, table: OpTable) -> Iterator[Node]:
    """The node, then each tensor it was exactly cast from, nearest first.

    All of them hold the same values: the walk stops at the first cast that rounds or changes anything
    but the dtype.
    """
    while True:
        yield node
        if not is_exact_cast(node, table):
            return
        node = cast_source(node, table)
