"""How a ``mean.dim`` becomes node types the released XNNPACK runtime already has.

The released runtime has no reduction node but global average pooling, which averages the two middle
dims of an NHWC tensor. edgefuse keeps the mean's input NCHW (no transposes) and reduces one run of
consecutive dims at a time, on the tensor viewed as ``[outer, reduced, inner]``:

- ``inner == 1`` (the run is last, as in every RMSNorm), the reduced size static and at most
  :data:`MAX_FULLY_CONNECTED_WIDTH`, and no lanes (next item): a ``FullyConnected`` with a constant
  ``[1, reduced]`` row of ``1/reduced``, in float32 (:mod:`edgefuse.xnnpack.visitors`). With a static
  ``outer > 1`` the row is the fully-connected's *input* and the data, viewed as ``[outer, reduced]``, its filter
  (``fully_connected_rows``): one output row of ``outer`` values, which uses the whole GEMM tile. With
  the row as the filter (``fully_connected``), each of the ``outer`` rows fills one column of a tile
  at least 8 wide; on the shared 2-core x86 machine it was measured on, a float32 RMSNorm of 32 x 2048
  ran at 0.77 of stock that way and 0.65 the other (0.88 and 0.72 in CPU time, in another run).
  At one row, or a run-time row count, the row is the filter: no reshape is needed (two run-time
  leading dims stay possible) and at one row it was the faster form.
- ``inner == 1`` and a wide static run (at least :data:`MIN_LANES_WIDTH` values, or
  :data:`MIN_SINGLE_ROW_LANES_WIDTH` at one row) that 32, 16 or 8 divides: *lanes*. The run, viewed as
  ``[outer, reduced / lanes, 1, lanes]``, is averaged per lane by ``GlobalAvgPooling2d`` (element j
  goes to lane ``j % lanes``; each lane holds the same number of values), then the ``lanes`` means by
  a ``FullyConnected`` with a ``[1, lanes]`` row of ``1/lanes`` (exact: a power of two). Against one
  fully-connected over the whole run, at 32 and 128 rows of 2048 (a mean alone and a Llama RMSNorm,
  float32 and float16, 1 thread) it took 0.56 to 0.79 of the time, and its ``lanes`` partial sums kept
  float32 errors 4 to 5 times smaller (about eager's), where one fully-connected over thousands of
  values drifts by several ulps.
- otherwise: ``GlobalAvgPooling2d`` on ``[outer, reduced, 1, inner]`` read as NHWC, which averages over
  ``reduced`` for each of ``inner`` channels, and works for a dynamic ``reduced`` too. A last-dim run
  wider than :data:`MAX_FULLY_CONNECTED_WIDTH` that no lane count divides is pooled this way too, with
  one channel: a fully-connected sums each row in one float32 chain, which drifts with the width.
  Against the float64 mean, in float32 units of the result, a row of ones came out 127 units off at
  65535 values, 49752 at 500001 and 263474 at 6291457, and 6291457 values in ``[0, 1)`` 19328 off;
  pooled, 0.5 or less for the ones and 560 for those values. Up to 65535 values the two were as close
  on values in ``[0, 1)`` (40 and 45 units at 65535) and the fully-connected ran 2.2 to 3.4 times
  faster (rows of 257 to 65535 values, float32 and float16, 1 thread).

Static reshapes go around each step where the shape needs it; XNNPACK infers at most one dim of a
reshape at run time, so a plan whose reshapes would need two unknown dims is refused with a reason,
and that mean stays outside the delegate. The plan is plain data: the partitioner config asks whether a
plan exists, the node visitor serializes it, the tests read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

#: A dim size that is only known at run time.
DYNAMIC = None

#: The most dims an XNNPACK tensor has (``XNN_MAX_TENSOR_DIMS``): the runtime refuses to define a larger one.
MAX_RANK = 6

#: Lane counts a wide last-dim mean is split into, most preferred first (see the module docstring).
LANES = (32, 16, 8)

#: The narrowest static reduced width averaged in lanes when the mean has several rows (or a run-time
#: row count); narrower ones are one fully-connected.
MIN_LANES_WIDTH = 256

#: The same for a mean of a single row, where the plain fully-connected stays ahead up to a wider row.
MIN_SINGLE_ROW_LANES_WIDTH = 1024

#: The widest static last-dim run one fully-connected averages when no lane count divides it; a wider
#: one is pooled (see the module docstring).
MAX_FULLY_CONNECTED_WIDTH = 65536


@dataclass(frozen=True)
class Step:
    """One serialized node: ``kind`` is ``reshape``, ``fully_connected`` (the ``1/W`` row is the filter),
    ``fully_connected_rows`` (the row is the input, the data the filter) or ``global_avg_pool``.

    ``shape`` is the node's output shape (None for a dim known only at run time), ``bound`` the same
    shape at the input's upper bounds (what XNNPACK is told when the program loads; it recomputes
    run-time dims itself); ``width`` is the reduced size a fully-connected averages over.
    """

    kind: str
    shape: tuple[int | None, ...]
    bound: tuple[int, ...]
    width: int | None = None


#: The step kinds that are a fully-connected against a constant ``1/W`` row.
FULLY_CONNECTED_KINDS = frozenset({"fully_connected", "fully_connected_rows"})


class PlanError(ValueError):
    """The mean cannot be expressed with the released node types; the message says why."""


def normalize_dims(dims: Sequence[int] | int | None, rank: int) -> tuple[int, ...]:
    """Sorted, non-negative reduced dims; an empty or missing ``dims`` means every dim, as in PyTorch."""
    if dims is None:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return tuple(range(rank))
    out = set()
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool):
            raise PlanError(f"mean dims must be ints, got {d!r}")
        if not -rank <= d < max(rank, 1):
            raise PlanError(f"mean dim {d} is out of range for a tensor of rank {rank}")
        if d % max(rank, 1) in out:
            raise PlanError(f"mean dim {d} appears twice")
        out.add(d % max(rank, 1))
    return tuple(sorted(out))


def output_shape(shape: Sequence[int | None], dims: Sequence[int], keepdim: bool) -> tuple[int | None, ...]:
    """The shape ``mean.dim`` produces."""
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def _product(sizes: Sequence[int | None]) -> int | None:
    return None if any(s is DYNAMIC for s in sizes) else math.prod(sizes)


def _runs(dims: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive dims, as ``(first, last)``, last run first."""
    runs: list[list[int]] = []
    for d in dims:
        if runs and runs[-1][1] == d - 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    return [tuple(r) for r in reversed(runs)]


def _reshape(steps: list[Step], current: tuple, target: tuple, bound: tuple) -> None:
    """Append a reshape from ``current`` to ``target`` unless they are the same; refuse two unknowns."""
    if tuple(current) == tuple(target):
        return
    if sum(1 for s in target if s is DYNAMIC) > 1:
        raise PlanError(
            f"the mean needs a reshape to {_show(target)}, and XNNPACK infers at most one run-time dim "
            "of a reshape"
        )
    steps.append(Step("reshape", tuple(target), tuple(bound)))


def _show(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if s is DYNAMIC else str(s) for s in shape) + "]"


def plan_mean(
    shape: Sequence[int | None],
    dims: Sequence[int] | int | None,
    keepdim: bool,
    bounds: Sequence[int] | None = None,
) -> list[Step]:
    """The nodes that compute ``x.mean(dims, keepdim)`` for an NCHW ``x`` of ``shape``.

    ``shape`` holds ints and None for dims known only at run time, ``bounds`` the upper bound of every
    dim (by default ``shape``, which must then be static). Raises :class:`PlanError` when the released
    node types cannot express the mean.
    """
    rank = len(shape)
    if bounds is None:
        if any(s is DYNAMIC for s in shape):
            raise PlanError("a shape with run-time dims needs their upper bounds")
        bounds = shape
    if len(bounds) != rank:
        raise PlanError(f"shape {_show(shape)} and bounds {list(bounds)} differ in rank")
    if rank == 0:
        raise PlanError("a mean of a 0-d tensor is the tensor itself; XNNPACK has nothing to do")
    if rank > MAX_RANK:
        raise PlanError(f"XNNPACK tensors have at most {MAX_RANK} dims, got {rank}")
    reduced = normalize_dims(dims, rank)
    if not keepdim and len(reduced) == rank:
        raise PlanError(
            "the mean produces a 0-d tensor, which the XNNPACK delegate cannot return (its executor "
            "fails on the dim order of a 0-d output)"
        )
    try:
        return _plan(shape, bounds, reduced, keepdim, pool_wide=True)
    except PlanError:
        # Lanes and pooling need reshapes one fully-connected can avoid (two run-time leading dims).
        return _plan(shape, bounds, reduced, keepdim, pool_wide=False)


def lanes_for(width: int | None, rows: int | None = None) -> int | None:
    """The lane count a static reduced ``width`` is averaged in over ``rows`` rows (None: known only at
    run time), or None for a plain fully-connected."""
    narrowest = MIN_SINGLE_ROW_LANES_WIDTH if rows == 1 else MIN_LANES_WIDTH
    if width is DYNAMIC or width < narrowest:
        return None
    return next((c for c in LANES if width % c == 0), None)


def _plan(shape, bounds, reduced, keepdim, pool_wide: bool) -> list[Step]:
    steps: list[Step] = []
    # The keepdim shape of the mean so far, and the shape of the last serialized value; each with bounds.
    logical, logical_bound = tuple(shape), tuple(bounds)
    current, current_bound = logical, logical_bound
    rank = len(shape)
    for first, last in _runs(reduced):
        outer, outer_bound = _product(logical[:first]), math.prod(logical_bound[:first])
        width, width_bound = _product(logical[first : last + 1]), math.prod(logical_bound[first : last + 1])
        inner, inner_bound = _product(logical[last + 1 :]), math.prod(logical_bound[last + 1 :])
        lanes = lanes_for(width, outer) if pool_wide and inner == 1 else None
        too_wide = pool_wide and width is not DYNAMIC and width > MAX_FULLY_CONNECTED_WIDTH
        fully_connected = inner == 1 and width is not DYNAMIC and not too_wide
        if lanes:
            _reshape(steps, current, (outer, width // lanes, 1, lanes), (outer_bound, width // lanes, 1, lanes))
            steps.append(Step("global_avg_pool", (outer, 1, 1, lanes), (outer_bound, 1, 1, lanes)))
            steps.append(Step("reshape", (outer, lanes), (outer_bound, lanes)))
            current, current_bound = (outer, 1), (outer_bound, 1)
            steps.append(Step("fully_connected", current, current_bound, lanes))
        elif fully_connected and outer is not DYNAMIC and outer > 1:
            _reshape(steps, current, (outer, width), (outer_bound, width_bound))
            current, current_bound = (1, outer), (1, outer_bound)
            steps.append(Step("fully_connected_rows", current, current_bound, width))
        elif fully_connected:
            if current == logical and first == last == rank - 1:
                current, current_bound = logical[:-1] + (1,), logical_bound[:-1] + (1,)
            else:
                _reshape(steps, current, (outer, width), (outer_bound, width_bound))
                current, current_bound = (outer, 1), (outer_bound, 1)
            steps.append(Step("fully_connected", current, current_bound, width))
        else:
            target = (outer, width, 1, inner)
            _reshape(steps, current, target, (outer_bound, width_bound, 1, inner_bound))
            current, current_bound = (outer, 1, 1, inner), (outer_bound, 1, 1, inner_bound)
            steps.append(Step("global_avg_pool", current, current_bound))
        ones = (1,) * (last + 1 - first)
        logical = logical[:first] + ones + logical[last + 1 :]
        logical_bound = logical_bound[:first] + ones + logical_bound[last + 1 :]
    _reshape(steps, current, output_shape(shape, reduced, keepdim), output_shape(bounds, reduced, keepdim))
    return steps


def rows(shape: Sequence[int | None], dims: Sequence[int] | int | None) -> int | None:
    """How many means the op computes (the product of the kept dims), or None when it is not static."""
    reduced = normalize_dims(dims, len(shape))
    return _product([s for i, s in enumerate(shape) if i not in reduced])


def width(shape: Sequence[int | None], dims: Sequence[int] | int | None) -> int | None:
    """How many values each mean averages (the product of the reduced dims), or None when it is not static."""
    reduced = normalize_dims(dims, len(shape))
    return _product([s for i, s in enumerate(shape) if i in reduced])
