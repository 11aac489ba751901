"""The seeded generator: case ``index`` of run ``seed`` is a pure function of the two numbers.

Each case draws from its own ``random.Random`` seeded with a string of ``seed`` and ``index``, so any
single case can be regenerated without replaying the cases before it, and a run of N cases is the first
N cases of a longer run with the same seed.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

import torch

from edgefuse.core import forms as registry
from edgefuse.core.casts import is_exact
from edgefuse.fuzz.spec import (
    DIMS_STYLES,
    DTYPES,
    HEADS_VIEWS,
    INVERSES,
    NEAR_MISSES,
    SQUARES,
    TAIL_KINDS,
    CastSpec,
    CaseSpec,
    NormSpec,
    Tail,
    WeightSpec,
    is_grouped,
)

HALF = ("float16", "bfloat16")
#: Input magnitudes. A norm computed wholly in float16 squares its input in float16, which overflows
#: above 256 and loses its precision below 1e-4 (subnormal squares); rms_norm computes in float32 and
#: does neither, as core/match.py's rule 7 documents. Cases with float16 anywhere (the input, a cast of the
#: norm or of the norm that feeds it) stay within 0.1-10, so that the checks judge the rewrite and not
#: that documented difference; the others also get 1e-3 and 100.
FLOAT16_SCALES = (0.1, 0.5, 1.0, 3.0, 10.0)
SCALES = (1e-3, 0.1, 1.0, 3.0, 100.0)
EPS_CHOICES = (1e-6, 1e-6, 1e-6, 1e-5, 1e-5, 1e-8, 1e-12, 1e-3, 0.1, 1.0, 0.0)
#: The eps of the "bad-eps" near miss.
BAD_EPS = (float("nan"), float("inf"), float("-inf"), -1e-3)
#: Ranks of the graph input (and their weights), the sizes of its leading dims and of its last dim.
RANKS = {2: 25, 3: 35, 4: 30, 5: 10}
LEAD_DIMS = (1, 2, 2, 3, 4)
LAST_DIMS = (1, 2, 3, 4, 5, 8, 8, 12, 16, 16, 16, 17, 24, 32, 32, 64)
#: What a last dim may be split by, into heads or groups.
DIVISORS = (2, 3, 4, 8)
#: The most trailing dims a norm normalizes.
MAX_NORMALIZED_DIMS = 2
#: How many ops may follow a norm (and how often), and the scalars they multiply by.
TAIL_COUNTS = {0: 60, 1: 30, 2: 10}
TAIL_VALUES = (2.0, 0.5, -1.5, 3.0)
#: Where a weight's values are centred (``WeightSpec.around``): each the registry's forms use (0 for
#: a ``1 + w`` weight, else 1).
AROUNDS = tuple(sorted({w.around for w in (f.weight for f in registry.FORMS.values()) if w is not None}))
#: Seeds of weights and tails are drawn below SEEDS, of inputs below INPUT_SEEDS.
SEEDS = 1 << 16
INPUT_SEEDS = 1 << 20


def _weighted(rng: random.Random, choices: dict) -> object:
    keys = list(choices)
    return rng.choices(keys, weights=[choices[k] for k in keys])[0]


def _dtype(rng: random.Random) -> str:
    return _weighted(rng, {"float32": 35, "float16": 30, "bfloat16": 30, "float64": 5})


def _upcast(rng: random.Random) -> str:
    """The dtype a norm computes in: mostly float32, sometimes the input's own or a narrower one."""
    return _weighted(rng, {"float32": 70, "float64": 8, "input": 10, "float16": 6, "bfloat16": 6})


def _resolve(dtype: str, input_dtype: str) -> str:
    return input_dtype if dtype == "input" else dtype


def _random_cast(rng: random.Random, rank: int) -> CastSpec:
    kinds = {"to": 40, "method": 20, "type_as": 20}
    if rank in (4, 5):
        kinds.update({"to-contiguous": 12, "to-channels-last": 8})
    kind = _weighted(rng, kinds)
    dtype = rng.choice((*DTYPES[:3], "input", "input"))
    if kind == "method" and dtype == "input":
        kind = "to"
    return CastSpec(kind, dtype)


def _weight(rng: random.Random, dtype: str, **overrides) -> WeightSpec:
    fields = dict(dtype=dtype, seed=rng.randrange(SEEDS))
    fields.update(overrides)
    return WeightSpec(**fields)


def instance(
    form: str, dtype: str, compute: str = "float32", weight_dtype: str | None = None, seed: int = 0, weighted: bool = True
) -> NormSpec:
    """The registry's ``form`` (:data:`edgefuse.core.forms.FORMS`) for an input of ``dtype``, computing in
    ``compute`` (a dtype or "input"), with a weight of ``weight_dtype`` (the input's by default) drawn
    from ``seed``; ``weighted=False`` leaves out a weight the form may go without."""
    entry = registry.FORMS[form]
    wdtype = weight_dtype or dtype

    def cast(c: registry.FormCast) -> CastSpec:
        target = {"compute": compute, "input": "input", "weight": wdtype, "half-weight": wdtype}[c.dtype]
        return CastSpec("to" if c.kind == "method" and target == "input" else c.kind, target)

    def casts(chain: tuple[registry.FormCast, ...]) -> tuple[CastSpec, ...]:
        return tuple(cast(c) for c in chain if c.dtype != "half-weight" or wdtype in HALF)

    weight = None
    if entry.weight is not None and (weighted or not entry.weight.optional):
        w = entry.weight
        weight = WeightSpec(
            dtype=dtype if w.dtype == "input" else wdtype, offset=w.offset, cast=cast(w.cast) if w.cast else None,
            left=w.left, around=w.around, seed=seed,
        )
    return NormSpec(
        form, pre=casts(entry.pre), var_pre=casts(entry.var_pre), square=entry.square,
        eps_how="left" if entry.eps_left else "right", inverse=entry.spelling, scale_left=entry.scale_left,
        mid=casts(entry.mid), weight=weight, post=casts(entry.post), groups=entry.groups,
    )


def template(form: str, rng: random.Random, dtype: str) -> NormSpec:
    """The norm ``form`` as real models write it, for an input of ``dtype``, computing in a random dtype."""
    up = _upcast(rng)
    wdtype = dtype if rng.random() < 0.7 else _dtype(rng)
    if form == "coreml":
        return NormSpec(form, weight=_weight(rng, wdtype, left=False))
    entry = registry.FORMS.get(form)
    if entry is None:
        raise ValueError(f"unknown form {form!r}")
    weighted = entry.weight is not None and (not entry.weight.optional or rng.random() < 0.8)
    seed = rng.randrange(SEEDS) if weighted else 0
    return instance(form, dtype, up, wdtype, seed, weighted)


def _perturb_casts(rng: random.Random, casts: tuple[CastSpec, ...], rank: int) -> tuple[CastSpec, ...]:
    casts = list(casts)
    if casts and rng.random() < 0.3:
        i = rng.randrange(len(casts))
        casts[i] = dataclasses.replace(casts[i], kind=_random_cast(rng, rank).kind)
        if casts[i].kind == "method" and casts[i].dtype == "input":
            casts[i] = CastSpec("to", "input")
    if casts and rng.random() < 0.12:
        del casts[rng.randrange(len(casts))]
    if rng.random() < 0.25:
        casts.insert(rng.randrange(len(casts) + 1), _random_cast(rng, rank))
    if rng.random() < 0.05:
        casts.insert(rng.randrange(len(casts) + 1), _random_cast(rng, rank))
    return tuple(casts)


def _perturb(rng: random.Random, norm: NormSpec, dtype: str, shape: tuple[int, ...]) -> NormSpec:
    """Random variations that keep the norm an rms_norm of one tensor (or not: the casts decide)."""
    rank = len(shape) if not norm.grouped else 0  # no dim-order casts around a split
    changes: dict = {}
    decomposed = norm.written_out
    if decomposed:
        for name in ("pre", "var_pre", "mid", "post"):
            changes[name] = _perturb_casts(rng, getattr(norm, name), rank)
        if rng.random() < 0.25:
            changes["square"] = rng.choice(SQUARES)
        if rng.random() < 0.2:
            changes["inverse"] = rng.choice((*INVERSES, "rsqrt", "div-sqrt"))  # the two most written, twice
        if rng.random() < 0.2:
            changes["dims_style"] = rng.choice(DIMS_STYLES[1:])  # not the default, "neg"
        if rng.random() < 0.2:
            changes["scale_left"] = not norm.scale_left
        if rng.random() < 0.06:
            changes["also_return_normalized"] = True
    elif rng.random() < 0.3:
        changes["pre"] = _perturb_casts(rng, norm.pre, rank)
        changes["post"] = _perturb_casts(rng, norm.post, rank)
    eps = rng.choice(EPS_CHOICES) if rng.random() < 0.85 else float(f"{10 ** rng.uniform(-12, 0):.3g}")
    if decomposed and rng.random() < 0.05:
        eps = None
    changes["eps"] = eps
    if decomposed and eps is not None:
        how = _weighted(rng, {"right": 70, "left": 15, "const": 15})
        if norm.eps_how == "left" and how == "right":
            how = "left"
        changes["eps_how"] = how
        changes["eps_dtype"] = rng.choice(("float32", "float32", dtype, "float64"))
    if len(shape) >= 3 and norm.form != "coreml" and not norm.grouped and rng.random() < 0.15:
        changes["dims"] = MAX_NORMALIZED_DIMS
    weight = norm.weight
    if weight is not None and not norm.functional:
        w: dict = {}
        if rng.random() < 0.25:
            w["dtype"] = _dtype(rng)
        if rng.random() < 0.2:
            w["left"] = not weight.left
        w["kind"] = _weighted(rng, {"param": 80, "buffer": 10, "input": 10})
        if rng.random() < 0.06:
            w["shape"] = "row"
        if weight.cast is None and rng.random() < 0.1:
            w["cast"] = _random_cast(rng, 1)
        weight = dataclasses.replace(weight, **w)
        if rng.random() < 0.08:
            weight = None
    elif weight is None and norm.takes_a_weight and rng.random() < 0.05:
        weight = _weight(rng, dtype)
    changes["weight"] = weight
    return dataclasses.replace(norm, **changes)


def _compute_dtype(norm: NormSpec, dtype: str) -> str:
    """The dtype of ``h``, the tensor the norm squares and scales."""
    for cast in reversed(norm.pre):
        return _resolve(cast.dtype, dtype)
    return dtype


def _widening_prefix(casts: Sequence[CastSpec], start: str, input_dtype: str) -> tuple[CastSpec, ...]:
    """The leading ``casts`` that keep every value of a ``start`` tensor (each to the same or a wider dtype)."""
    kept, current = [], start
    for cast in casts:
        dtype = _resolve(cast.dtype, input_dtype)
        if not is_exact(getattr(torch, current), getattr(torch, dtype)):
            break
        kept.append(cast)
        current = dtype
    return tuple(kept)


def _near_miss(rng: random.Random, kind: str, norm: NormSpec, dtype: str, shape: tuple[int, ...]) -> NormSpec:
    """Make ``norm`` compute something that is not an rms_norm of one tensor."""
    if not norm.written_out and kind != "coreml":
        norm = dataclasses.replace(template("llama", rng, dtype), eps=norm.eps or 1e-6)
    rank = len(shape)
    if kind == "other-scaled":
        return dataclasses.replace(norm, scaled="other")
    if kind == "rounded-scaled":
        h = _compute_dtype(norm, dtype)
        via = {"float32": rng.choice(HALF), "float64": rng.choice(("float32", *HALF)), "float16": "bfloat16"}.get(h)
        if via is None:  # no float dtype rounds every bfloat16 value in 0.1-100: scale another tensor instead
            return dataclasses.replace(norm, scaled="other")
        # The square must read h's own values: a var_pre cast that rounds them (to ``via``, as the
        # scaled copy is) would make both hold the same values, one tensor's square after all.
        var_pre = _widening_prefix(norm.var_pre, h, dtype)
        return dataclasses.replace(norm, scaled="rounded", rounded_via=via, var_pre=var_pre)
    if kind == "cube":
        return dataclasses.replace(norm, square="pow3")
    if kind == "cube-mul":
        return dataclasses.replace(norm, square="mul3")
    if kind == "product":
        return dataclasses.replace(norm, square="product")
    if kind == "wrong-dim":
        options = [(-2,), (0,)] + ([(1,), (-3, -1), (0, -1)] if rank >= 3 else [])
        dims = rng.choice(options)
        if norm.grouped:  # the mean reads the split tensor, one rank higher
            dims = rng.choice([(-2,), (0,), (-3, -1)])
        return dataclasses.replace(norm, mean_dims=dims, dims=1)
    if kind == "no-keepdim":
        return dataclasses.replace(norm, keepdim=False, dims=1)
    eps = norm.eps if norm.eps not in (None, 0.0) else 1e-6
    if kind == "eps-input":
        return dataclasses.replace(norm, eps=eps, eps_how="input")
    if kind == "eps-row":
        return dataclasses.replace(norm, eps=eps, eps_how="row")
    if kind == "eps-vector":
        if _prod(shape[len(shape) - norm.dims :]) < 2:  # a one-element "vector" is a scalar eps
            return dataclasses.replace(norm, eps=eps, eps_how="row")
        return dataclasses.replace(norm, eps=eps, eps_how="vector")
    if kind == "eps-outside":
        return dataclasses.replace(norm, eps=eps, eps_how="outside")
    if kind == "bad-eps":
        bad = rng.choice(BAD_EPS)
        return dataclasses.replace(norm, eps=bad, eps_how=rng.choice(("right", "left", "const")))
    if kind == "coreml":
        return dataclasses.replace(template("coreml", rng, dtype), eps=eps)
    raise ValueError(f"unknown near miss {kind!r}")


def computes_in_float16(dtype: str, *norms: NormSpec | None) -> bool:
    """Whether the input or any cast of the case's norms (or of their weights) is float16."""
    dtypes = {dtype}
    for norm in norms:
        if norm is None:
            continue
        dtypes.update(c.dtype for c in (*norm.pre, *norm.var_pre, *norm.mid, *norm.post))
        if norm.weight is not None and norm.weight.cast is not None:
            dtypes.add(norm.weight.cast.dtype)
    return "float16" in dtypes


def _shape(rng: random.Random, rank: int, width: int) -> tuple[int, ...]:
    lead = [rng.choice(LEAD_DIMS) for _ in range(rank - 1)]
    while lead and _prod(lead) * width > 768:
        i = max(range(len(lead)), key=lambda j: lead[j])
        lead[i] = max(1, lead[i] // 2)
        if all(d == 1 for d in lead):
            break
    return (*lead, width)


def _prod(values: Sequence[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _divisor(rng: random.Random, width: int) -> int | None:
    options = [d for d in DIVISORS if width % d == 0 and width // d >= 2]
    return rng.choice(options) if options else None


def generate(seed: int, index: int, near_miss_rate: float = 0.3) -> CaseSpec:
    """Case ``index`` of the run seeded ``seed``."""
    rng = random.Random(f"edgefuse-fuzz:{seed}:{index}")
    near = rng.choice(NEAR_MISSES) if rng.random() < near_miss_rate else None
    form = "coreml" if near == "coreml" else rng.choice(list(registry.FORMS))
    dtype = _dtype(rng)
    rank = _weighted(rng, RANKS)
    width = rng.choice(LAST_DIMS)
    grouped = is_grouped(form)
    heads = 1
    if rank <= 4 and not grouped and rng.random() < 0.12:
        heads = _divisor(rng, width) or 1
    if grouped:
        if _divisor(rng, width) is None:
            width = 16
    shape = _shape(rng, rank, width)
    channels_last = rank in (4, 5) and rng.random() < 0.4
    norm_shape = (*shape[:-1], heads, width // heads) if heads > 1 else shape

    norm = template(form, rng, dtype)
    if grouped:
        norm = dataclasses.replace(norm, groups=_divisor(rng, width))
    norm = _perturb(rng, norm, dtype, norm_shape)
    if near is not None:
        norm = _near_miss(rng, near, norm, dtype, norm_shape)
    if norm.functional:
        if norm.eps is None:
            norm = dataclasses.replace(norm, eps=1e-6)
        if norm.weight is not None:  # F.rms_norm wants a weight of the input's dtype
            norm = dataclasses.replace(norm, weight=dataclasses.replace(norm.weight, dtype=_compute_dtype(norm, dtype)))

    feed = None
    if rng.random() < 0.12:
        feed_form = rng.choice([f for f in registry.FORMS if not is_grouped(f)])
        feed = template(feed_form, rng, dtype)
        if feed.weight is not None:
            feed = dataclasses.replace(feed, weight=dataclasses.replace(feed.weight, dtype=dtype))
        if feed.functional and feed.weight is not None:
            feed = dataclasses.replace(feed, weight=dataclasses.replace(feed.weight, dtype=_compute_dtype(feed, dtype)))
        feed = dataclasses.replace(feed, post=(*feed.post, CastSpec("to", "input")))

    tails = []
    for _ in range(_weighted(rng, TAIL_COUNTS)):
        kind = rng.choice(TAIL_KINDS)
        tails.append(Tail(kind, dtype=_dtype(rng), value=rng.choice(TAIL_VALUES), seed=rng.randrange(SEEDS)))

    scale = rng.choice(FLOAT16_SCALES if computes_in_float16(dtype, norm, feed) else SCALES)
    return CaseSpec(
        seed=seed,
        index=index,
        shape=shape,
        dtype=dtype,
        norm=norm,
        channels_last=channels_last,
        scale=scale,
        zero_row=rng.random() < 0.08,
        residual=rng.random() < 0.15,
        feed=feed,
        heads=heads,
        heads_view=rng.choice(HEADS_VIEWS) if not channels_last else "reshape",
        tails=tuple(tails),
        return_input=rng.random() < 0.06,
        near_miss=near,
        input_seed=rng.randrange(INPUT_SEEDS),
    )


def features(spec: CaseSpec) -> set[str]:
    """What a case exercises, for coverage counts: its form, near miss, casts, neighbours, dtypes."""
    norm = spec.norm
    out = {f"form:{norm.form}", f"dtype:{spec.dtype}", f"rank:{len(spec.shape)}"}
    if spec.near_miss:
        out.add(f"near-miss:{spec.near_miss}")
    if spec.channels_last:
        out.add("channels-last")
    for name in ("pre", "var_pre", "mid", "post"):
        for cast in getattr(norm, name):
            out.add(f"cast:{cast.kind}")
            resolved = _resolve(cast.dtype, spec.dtype)
            out.add(f"cast-dtype:{resolved}")
    if spec.residual:
        out.add("neighbour:residual-in")
    if spec.feed is not None:
        out.add("neighbour:feed-norm")
    if spec.heads > 1:
        out.add(f"neighbour:heads-{spec.heads_view}")
    if norm.grouped:
        out.add("neighbour:grouped-reshape")
    for tail in spec.tails:
        out.add(f"neighbour:{tail.kind}")
    if spec.return_input or norm.also_return_normalized:
        out.add("neighbour:extra-output")
    if norm.weight is not None:
        out.add(f"weight:{norm.weight.kind}")
        out.add(f"weight-dtype:{norm.weight.dtype}")
        if norm.weight.shape == "row":
            out.add("weight:row-shape")
        if norm.weight.offset:
            out.add("weight:offset")
    else:
        out.add("weight:none")
    if norm.dims == 2:
        out.add("normalized-dims:2")
    out.add(f"square:{norm.square}")
    out.add(f"inverse:{norm.inverse}")
    out.add(f"dims:{norm.dims_style}")
    out.add(f"eps:{norm.eps_how}" if norm.eps is not None else "eps:none")
    if spec.zero_row:
        out.add("input:zero-row")
    return out
