"""Shrink a failing case: drop neighbours, casts and options while the same check still fails the same way.

Greedy and bounded: each candidate is one simplification of the current spec; the first one that still
fails (same check, same kind of finding) becomes the current spec, until no candidate fails or the
budget of attempts runs out. A near miss keeps what makes it a near miss.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterator

from edgefuse.fuzz.check import Finding
from edgefuse.fuzz.spec import CaseSpec, NormSpec
from edgefuse.fuzz.units import run_unit


def _norm_candidates(norm: NormSpec, near: str | None) -> Iterator[NormSpec]:
    r = dataclasses.replace
    for name in ("pre", "var_pre", "mid", "post"):
        casts = getattr(norm, name)
        for i in range(len(casts)):
            yield r(norm, **{name: casts[:i] + casts[i + 1 :]})
    if norm.weight is not None:
        yield r(norm, weight=None)
        w = norm.weight
        if w.cast is not None:
            yield r(norm, weight=r(w, cast=None))
        if w.offset:
            yield r(norm, weight=r(w, offset=False, around=1.0))
        if w.kind != "param":
            yield r(norm, weight=r(w, kind="param"))
        if w.shape != "normalized":
            yield r(norm, weight=r(w, shape="normalized"))
        if not w.left:
            yield r(norm, weight=r(w, left=True))
    if norm.also_return_normalized:
        yield r(norm, also_return_normalized=False)
    if norm.scale_left:
        yield r(norm, scale_left=False)
    if norm.inverse != "rsqrt":
        yield r(norm, inverse="rsqrt")
    if norm.dims != 1 and norm.mean_dims is None:
        yield r(norm, dims=1)
    if near is None:
        if norm.square != "pow2":
            yield r(norm, square="pow2")
        if norm.eps_how not in ("right",) and norm.eps is not None:
            yield r(norm, eps_how="right")
        if norm.eps not in (1e-6,) and norm.eps is not None:
            yield r(norm, eps=1e-6)


def candidates(spec: CaseSpec) -> Iterator[CaseSpec]:
    """One-step simplifications of ``spec``, the biggest first."""
    r = dataclasses.replace
    if spec.feed is not None:
        yield r(spec, feed=None)
    for i in range(len(spec.tails)):
        yield r(spec, tails=spec.tails[:i] + spec.tails[i + 1 :])
    if spec.residual:
        yield r(spec, residual=False)
    if spec.heads > 1:
        yield r(spec, heads=1)
    if spec.return_input:
        yield r(spec, return_input=False)
    if spec.zero_row:
        yield r(spec, zero_row=False)
    if spec.channels_last:
        yield r(spec, channels_last=False)
    lead = spec.shape[:-1]
    if len(spec.shape) > 2 and not spec.channels_last:
        yield r(spec, shape=spec.shape[1:])
    if any(d > 1 for d in lead):
        yield r(spec, shape=(*(min(d, 2) if i == 0 else 1 for i, d in enumerate(lead)), spec.shape[-1]))
    width = spec.shape[-1]
    for smaller in (4, 8):
        if smaller < width and spec.heads == 1 and (not spec.norm.grouped or smaller % spec.norm.groups == 0):
            yield r(spec, shape=(*lead, smaller))
    if spec.feed is not None:
        for feed in _norm_candidates(spec.feed, None):
            yield r(spec, feed=feed)
    for norm in _norm_candidates(spec.norm, spec.near_miss):
        yield r(spec, norm=norm)


def _fails(spec: CaseSpec, finding: Finding) -> Finding | None:
    for result in run_unit([spec], [finding.check]):
        for found in result.findings:
            if found.kind == finding.kind:
                return found
    return None


def shrink(finding: Finding, max_attempts: int = 80, max_seconds: float = 180.0) -> Finding:
    """The smallest failing variant of ``finding``'s case that the budget finds (``finding`` itself if none)."""
    current = finding
    attempts, start = 0, time.perf_counter()
    improved = True
    while improved:
        improved = False
        for candidate in candidates(current.spec):
            if attempts >= max_attempts or time.perf_counter() - start > max_seconds:
                return current
            attempts += 1
            found = _fails(candidate, current)
            if found is not None:
                current = found
                improved = True
                break
    return current
