"""The tolerances of the property check, each derived from a dtype the graph computes in.

A rebuilt norm may round once where the decomposed one rounded twice: about one unit in the last place
(ulp) of the norm's dtype D, so the check allows ``ULPS`` = 2 ulps of D at the largest magnitude
(:func:`edgefuse.core.verify.tolerance`). At a graph output, that difference may have passed through an op
that rounds to a coarser dtype, where it can flip one rounding: the output's tolerance is then in the
coarsest dtype on any path from a rebuilt norm to it (:func:`edgefuse.core.verify.output_tolerance_dtypes`,
imported here with :data:`~edgefuse.core.verify.FLOATS` for the fuzzer's modules). Nothing here is
widened to make a case pass.
"""

from __future__ import annotations

import torch

from edgefuse.core.verify import FLOATS, TOLERANCES, Comparison, compare, output_tolerance_dtypes  # noqa: F401  (the fuzzer's names)

#: :data:`edgefuse.core.verify.TOLERANCES`' "rebuilt norm": the check's units in the last place.
ULPS = TOLERANCES["rebuilt norm"].ulps


def compare_at(expected: torch.Tensor, actual: torch.Tensor, dtype: torch.dtype | None, ulps: float = ULPS) -> Comparison:
    """:func:`edgefuse.core.verify.compare` at ``ulps`` units of ``dtype`` (the expected tensor's dtype if None).

    NaN and inf must sit at the same places in both (an infinite error otherwise); the finite values
    agree within ``ulps`` units in the last place of ``dtype`` at the largest finite expected magnitude.
    """
    if dtype is not None and not dtype.is_floating_point:
        dtype = None
    return compare(expected, actual, ulps, dtype)


def eps_values(norm, input_dtype: str) -> set[float]:
    """The eps values a rebuilt ``norm`` (a :class:`~edgefuse.fuzz.spec.NormSpec`) may carry when the
    case's input is ``input_dtype``.

    The graph may hold eps rounded to any float dtype on its way (a constant eps tensor, the float32
    tensor ``to_edge`` lifts a Python float into, the dtype a decomposition adds in), and such a rounding
    changes eps by less than one unit of the norm's dtype. Zero is different: it is allowed only where
    eps rounds to zero in the dtype the model adds it in (core/match.py's rule 4), that is the dtype of the
    variance (the last cast before the square; ``"input"`` is the case's input dtype), promoted with a
    constant eps tensor's dtype (a Python float that ``to_edge`` lifts is a 0-d tensor: no promotion).
    """
    if norm.eps is None:
        return {0.0}
    casts = (*norm.pre, *norm.var_pre)
    variance = getattr(torch, casts[-1].dtype if casts and casts[-1].dtype != "input" else input_dtype)
    stored, added_in = norm.eps, variance
    if norm.eps_how == "const":
        eps_dtype = getattr(torch, norm.eps_dtype)
        stored = float(torch.tensor(norm.eps, dtype=eps_dtype))
        added_in = torch.promote_types(variance, eps_dtype)
    values = {norm.eps} | {float(torch.tensor(v, dtype=d)) for v in (norm.eps, stored) for d in FLOATS}
    values.discard(0.0)
    if stored == 0.0 or float(torch.tensor(stored, dtype=added_in)) == 0.0:
        values.add(0.0)
    return values
