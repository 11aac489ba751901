"""Verification: run two programs on the same inputs and compare with a tolerance from the dtype.

A rebuilt norm may round once where the decomposed one rounded twice: about one unit in the last place
of the norm's dtype. At a graph output, that difference may have passed through ops that compute in a
coarser dtype than the output's own (a float16 norm whose result is cast to float32), so an output is
compared at the coarsest dtype on any path from a rebuilt norm to it (:func:`output_tolerance_dtypes`).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.fx import GraphModule, Node
from torch.utils import _pytree as pytree

from edgefuse.core.fresh import fresh, kept_state

#: The float dtypes, finest first.
FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Tolerance:
    """What a check allows between a result and its reference: ``ulps`` units in the last place of the
    dtype compared, at the reference's largest magnitude (:func:`tolerance`), and why that many."""

    ulps: float
    why: str


#: Every check's tolerance, in one table that the core, the backends, the application, the fuzzer and the
#: tests read. A unit is the dtype's own (``torch.finfo(dtype).eps``: 1.2e-7 for float32, 9.8e-4 for
#: float16, 7.8e-3 for bfloat16), so each entry holds for every dtype.
TOLERANCES: dict[str, Tolerance] = {
    "rebuilt norm": Tolerance(2.0, "a rebuilt rms_norm against the norm it replaced, on the same input: it "
                                   "rounds to D once where the model may round twice, and a root with a "
                                   "division rounds where rsqrt rounds once (1.6 units over a million values)"),
    "rewritten program": Tolerance(4.0, "a program's outputs after the rewrite against before it: each rebuilt "
                                        "norm may round once where the model rounded twice, on its way to the "
                                        "output"),
    "qnn set-up": Tolerance(4.0, "one float16 RmsNorm on the HTP against eager: input and weight rounded to "
                                 "float16 (half a unit each), the mean of squares and its root in float16 (a "
                                 "unit each), the output rounded (half a unit)"),
    "lowered program": Tolerance(8.0, "a lowered program run in the runtime against eager: the delegate sums in "
                                      "its own order, and each op of a small model may round once differently"),
    "beside stock": Tolerance(1.0, "edgefuse's lowered program against stock's, both off eager by more than "
                                   "allowed: edgefuse's may be off by a unit more, as its rebuilt norm rounds "
                                   "where stock's decomposed one rounds otherwise; more is a finding"),
    "qnn float16": Tolerance(8.0, "a float16 QNN program on the HTP emulator against eager: the HTP rounds each "
                                  "op's result to float16, about 16 such roundings in a layer or two (a deeper "
                                  "model carries more)"),
    "qnn sweep float16": Tolerance(20.0, "a float16 norm the QNN sweep counts wrong: far over the few roundings a "
                                         "right HTP RmsNorm makes (4 units, 'qnn set-up'), far under how far a "
                                         "wrong one is off (about its own magnitude: 1000 units)"),
    "qnn sweep quantized": Tolerance(8.0, "a quantized norm the QNN sweep counts wrong, here in quantization steps "
                                          "of its output: a right one lands within 5 steps of the fake-quantized "
                                          "module (measured at 8a8w and 16a8w), a wrong one over 100 steps off"),
    "model logits": Tolerance(64.0, "a whole model's logits in the runtime against eager: the delegate sums in "
                                    "its own order through tens of ops, each of which may round once differently"),
}


def ulp(dtype: torch.dtype) -> float:
    """The distance from 1 to the next value of a float dtype (machine epsilon)."""
    return torch.finfo(dtype).eps


def tolerance(dtype: torch.dtype, reference: torch.Tensor, ulps: float = TOLERANCES["rebuilt norm"].ulps) -> float:
    """The absolute error allowed against ``reference``: ``ulps`` units in the last place of its largest value.

    One rebuilt norm may round once where the decomposed one rounded twice (about one unit in the last
    place of its output), and the backend computes in its own order; two units cover both (a norm written
    as ``x / sqrt(...)``, which ``rms_norm`` computes with ``rsqrt``, came to 1.6 over a million values,
    though single small elements move by up to about 3 of their own units). The bound is
    norm-wise, at the largest magnitude, because later ops (a residual add) may cancel a norm's value to
    near zero while keeping its rounding; it is never below the dtype's smallest normal value.
    """
    if not _inexact(dtype):
        return 0.0  # integers and booleans must match exactly
    scale = float(reference.detach().abs().max()) if reference.numel() else 0.0
    return ulps * ulp(dtype) * max(scale, torch.finfo(dtype).tiny)


@dataclass(frozen=True)
class Comparison:
    """How one output of a rewritten program compares with the reference."""

    dtype_ok: bool
    shape_ok: bool
    max_error: float
    allowed: float

    @property
    def ok(self) -> bool:
        return self.dtype_ok and self.shape_ok and self.max_error <= self.allowed


def _with_specials(a: torch.Tensor, r: torch.Tensor, error: torch.Tensor) -> torch.Tensor:
    """``error`` where both values are finite; 0 where both are the same NaN or infinity, inf elsewhere."""
    same_special = (torch.isnan(a) & torch.isnan(r)) | (torch.isinf(a) & (a == r))
    special = ~torch.isfinite(a) | ~torch.isfinite(r)
    return torch.where(same_special, 0.0, torch.where(special, float("inf"), error))


def compare(
    reference: torch.Tensor, actual: torch.Tensor, ulps: float = TOLERANCES["rebuilt norm"].ulps, dtype: torch.dtype | None = None
) -> Comparison:
    """Compare ``actual`` with ``reference`` at the tolerance of ``dtype`` (by default the reference's).

    Pass the norm's dtype when a wider op follows the norm: the rounding a rebuilt norm may move is one
    of the norm's dtype, whatever the output's. Outputs that are not floating point must match exactly.
    """
    if not _inexact(reference.dtype):
        dtype = reference.dtype
    dtype_ok = actual.dtype == reference.dtype
    shape_ok = actual.shape == reference.shape
    if not shape_ok:
        return Comparison(dtype_ok, False, float("inf"), 0.0)
    allowed = finite_tolerance(dtype or reference.dtype, reference, ulps)
    return Comparison(dtype_ok, True, max_error(reference, actual), allowed)


def _inexact(dtype: torch.dtype) -> bool:
    """Whether values of ``dtype`` are rounded: floats, and complex numbers (a float pair)."""
    return dtype.is_floating_point or dtype.is_complex


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64, a complex tensor as its real and imaginary parts (float64 would drop the
    imaginary part, and a NaN in either part would hide the other's difference)."""
    t = t.detach()
    return (torch.view_as_real(t.resolve_conj()) if t.is_complex() else t).double()


def max_error(reference: torch.Tensor, actual: torch.Tensor) -> float:
    """The largest absolute difference of two same-shaped tensors; where either is not finite, 0 when
    both hold the same NaN or infinity and inf otherwise (a ``-inf`` mask value matched is no error).

    Integers and booleans of one dtype are compared exactly (float64 holds no int64 above 2**53): any
    difference is at least 1. Other tensors are compared in float64, complex ones part by part (real
    and imaginary), and a complex tensor against a real one differs by inf; callers report a dtype
    mismatch themselves.
    """
    if actual.dtype == reference.dtype and not _inexact(reference.dtype):
        if torch.equal(actual.detach(), reference.detach()):
            return 0.0
        return max(1.0, float((actual.detach().double() - reference.detach().double()).abs().max()))
    if actual.is_complex() != reference.is_complex():
        return float("inf")
    a, r = _wide(actual), _wide(reference)
    error = _with_specials(a, r, (a - r).abs())
    return float(error.max()) if error.numel() else 0.0


def mean_error(reference: torch.Tensor, actual: torch.Tensor) -> float:
    """The mean absolute difference of two float tensors of one shape: steadier than the largest, which one
    rounding at one element sets. Tensors of different shapes raise ValueError rather than broadcast; two
    empty tensors differ by 0.0, as in :func:`max_error`."""
    if actual.shape != reference.shape:
        raise ValueError(f"no mean error between shapes {tuple(reference.shape)} and {tuple(actual.shape)}")
    if not reference.numel():
        return 0.0
    return float((reference.double() - actual.double()).abs().mean())


def finite_tolerance(dtype: torch.dtype, reference: torch.Tensor, ulps: float = TOLERANCES["rebuilt norm"].ulps) -> float:
    """:func:`tolerance` at the largest finite magnitude of ``reference`` (its infinities and NaNs must
    match exactly, see :func:`max_error`, and give no scale)."""
    r = reference.detach()
    return tolerance(dtype, r[torch.isfinite(r)] if _inexact(r.dtype) else r, ulps)


def compare_elementwise(
    reference: torch.Tensor, actual: torch.Tensor, ulps: float = TOLERANCES["rebuilt norm"].ulps, dtype: torch.dtype | None = None
) -> Comparison:
    """Each element within ``ulps`` units in the last place of its own magnitude (at least the smallest normal).

    For the output of one norm, or of a norm times a weight, where no later op cancels values: a moved
    rounding or a wrong eps shows on the small elements that the norm-wise bound of :func:`compare`
    forgives. ``max_error`` and ``allowed`` are in those units.
    """
    dtype = dtype or reference.dtype
    if actual.shape != reference.shape:
        return Comparison(actual.dtype == reference.dtype, False, float("inf"), ulps)
    a, r = _wide(actual), _wide(reference)
    # each part in units of the value's magnitude (a complex value's, not its part's)
    magnitude = reference.detach().abs().double().unsqueeze(-1) if reference.is_complex() else r.abs()
    units = _with_specials(a, r, (a - r).abs() / (ulp(dtype) * magnitude.clamp(min=torch.finfo(dtype).tiny)))
    worst = float(units.max()) if units.numel() else 0.0
    return Comparison(actual.dtype == reference.dtype, True, worst, ulps)


def _ulp_or_zero(dtype: torch.dtype | None) -> float:
    return torch.finfo(dtype).eps if dtype is not None and dtype.is_floating_point else 0.0


def _coarsest(unit: float) -> torch.dtype:
    """The float dtype whose unit in the last place is ``unit`` (the finest one at least that coarse)."""
    for dtype in reversed(FLOATS):
        if torch.finfo(dtype).eps <= unit:
            return dtype
    return torch.bfloat16


def output_tolerance_dtypes(
    graph_module: GraphModule, new_nodes: set[str], known: dict[str, torch.dtype] | None = None
) -> list[torch.dtype | None]:
    """For each graph output, the coarsest dtype on any path from a rebuilt node to it (None: no path).

    ``new_nodes`` names the rebuilt nodes; ``known`` gives dtypes by node name for nodes whose metadata
    is missing (hostile graphs). The list follows the leaves of the graph's output node.
    """
    known = known or {}
    worst: dict[Node, float] = {}
    for node in graph_module.graph.nodes:
        value = node.meta.get("val")
        own = _ulp_or_zero(value.dtype) if isinstance(value, torch.Tensor) else _ulp_or_zero(known.get(node.name))
        reached = [worst[n] for n in node.all_input_nodes if n in worst]
        if node.op != "output" and (reached or node.name in new_nodes):
            worst[node] = max([own, *reached])
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    return [
        _coarsest(worst[arg]) if isinstance(arg, Node) and arg in worst else None
        for arg in pytree.tree_leaves(list(results))
    ]


def outputs(program: Callable[..., Any], inputs: Sequence[Any]) -> list[torch.Tensor]:
    """The flattened tensor outputs of ``program`` on a copy of ``inputs``; a module's state is put back
    after the run (:mod:`edgefuse.core.fresh`)."""
    keep = kept_state(program) if isinstance(program, torch.nn.Module) else contextlib.nullcontext()
    with torch.no_grad(), keep:
        result = fresh(program(*copy.deepcopy(tuple(inputs))))  # an output may be a buffer put back
    return [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]


def compare_programs(
    reference: Callable[..., Any], rewritten: Callable[..., Any], inputs: Sequence[Any], ulps: float = TOLERANCES["rebuilt norm"].ulps
) -> list[Comparison]:
    """Run both programs on the same inputs and compare each output at its dtype's tolerance."""
    expected, actual = outputs(reference, inputs), outputs(rewritten, inputs)
    if len(expected) != len(actual):
        raise ValueError(f"the programs return {len(expected)} and {len(actual)} tensors")
    return [compare(e, a, ulps) for e, a in zip(expected, actual)]
