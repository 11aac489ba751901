"""The tolerances of the property check, each derived from a dtype the graph computes in.

A rebuilt norm may round once where the decomposed one rounded twice: about one unit in the last place
(ulp) of the norm's dtype D, so the check allows ``ULPS`` = 2 ulps of D at the largest magnitude
(:func:`edgefuse.verify.tolerance`). At a graph output, that difference may have passed through an op
that rounds to a coarser dtype, where it can flip one rounding: the output's tolerance is then in the
coarsest dtype on any path from a rebuilt norm to it (:func:`edgefuse.verify.output_tolerance_dtypes`,
imported here with :data:`~edgefuse.verify.FLOATS` for the fuzzer's modules). Nothing here is
widened to make a case pass.
"""

from __future__ import annotations

import torch

from edgefuse.verify import FLOATS, Comparison, compare, output_tolerance_dtypes  # noqa: F401  (the fuzzer's names)

ULPS = 2.0


def compare_at(expected: torch.Tensor, actual: torch.Tensor, dtype: torch.dtype | None, ulps: float = ULPS) -> Comparison:
    """:func:`edgefuse.verify.compare` at ``ulps`` units of ``dtype`` (the expected tensor's dtype if None).

    NaN and inf must sit at the same places in both (an infinite error otherwise); the finite values
    agree within ``ulps`` units in the last place of ``dtype`` at the largest finite expected magnitude.
    """
    if dtype is not None and not dtype.is_floating_point:
        dtype = None
    return compare(expected, actual, ulps, dtype)


def eps_values(norm, input_dtype: str) -> set[float]:
    """The eps values a rebuilt ``norm`` (a :class:`~edgefuse.fuzz.spec.NormSpec`) may carry when the
    case's input is ``input_dtype``: eps as written, the value a constant eps tensor holds, and that value
    rounded to the dtype the model adds it in (0 where it underflows there, as match.py's rule 4 takes
    it). The variance the model adds eps to has the dtype of the last cast before the square (``"input"``
    is the case's input dtype); a constant eps tensor promotes with it.
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
    return {norm.eps, stored, float(torch.tensor(stored, dtype=added_in))}
