"""Check a spec read from a file against what the generator can make, before anything is rendered.

A reproducer's ``SPEC`` is data from a file someone may have sent: :func:`cases` takes the literal
:func:`edgefuse.fuzz.reproducer.read_specs` parsed and returns the :class:`~edgefuse.fuzz.spec.CaseSpec`
list only when every field holds a value the generator (or the shrinker) can produce: names from the
fixed sets of :mod:`edgefuse.fuzz.spec` and :mod:`edgefuse.fuzz.generate`, integers and floats in the
ranges the generator draws from, tuples of the right length, and the few relations between fields the
renderer relies on (a split divides the width it splits). Anything else raises :class:`SpecError`, which
names the field. The sets are looked up when a file is checked, so a form or value added to the
generator is valid without an edit here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from edgefuse.fuzz import generate as gen
from edgefuse.fuzz import spec as sp

#: At most this many cases in one file (the fuzzer writes a unit's batch, 8 by default).
MAX_CASES = 64
#: Casts in one of a norm's cast chains: a template writes one, the generator inserts up to two more, a
#: feeding norm gets one more after its own.
MAX_CASTS = 8
_INT64 = 1 << 63


class SpecError(ValueError):
    """A field of a spec that the generator cannot have written; ``field`` is its path (``SPEC[0].norm.eps``)."""

    def __init__(self, field: str, why: str):
        self.field = field
        super().__init__(f"{field}: {why}")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- one field ----------------------------------------------------------------------------------------

Check = Callable[[str, Any], Any]


def one_of(values: Callable[[], tuple]) -> Check:
    """A name from the set ``values()`` returns (looked up at check time)."""

    def check(field: str, value: Any) -> Any:
        allowed = tuple(values())
        if not (isinstance(value, str) and value in allowed):
            raise SpecError(field, f"{_show(value)} is not one of {', '.join(map(str, dict.fromkeys(allowed)))}")
        return value

    return check


def integer(low: Callable[[], int], high: Callable[[], int]) -> Check:
    """An ``int`` (not a bool) in ``[low(), high()]``."""

    def check(field: str, value: Any) -> Any:
        if type(value) is not int:
            raise SpecError(field, f"{_show(value)} is not an integer")
        if not low() <= value <= high():
            raise SpecError(field, f"{value} is outside {low()}..{high()}")
        return value

    return check


def number_in(values: Callable[[], tuple]) -> Check:
    """A float (or an int, as a file may write ``2``) equal to one of ``values()``; NaN matches NaN."""

    def check(field: str, value: Any) -> Any:
        if type(value) not in (int, float):
            raise SpecError(field, f"{_show(value)} is not a number")
        allowed = values()
        if not any(value == v or (math.isnan(value) and math.isnan(v)) for v in allowed):
            raise SpecError(field, f"{value!r} is not one of {', '.join(map(repr, dict.fromkeys(allowed)))}")
        return float(value)

    return check


def boolean(field: str, value: Any) -> Any:
    if type(value) is not bool:
        raise SpecError(field, f"{_show(value)} is not True or False")
    return value


def optional(check: Check) -> Check:
    def inner(field: str, value: Any) -> Any:
        return None if value is None else check(field, value)

    return inner


def sequence(check: Check, low: int, high: Callable[[], int]) -> Check:
    """A tuple (or list) of ``low`` to ``high()`` items, each passing ``check``."""

    def inner(field: str, value: Any) -> Any:
        if not isinstance(value, (tuple, list)):
            raise SpecError(field, f"{_show(value)} is not a tuple")
        if not low <= len(value) <= high():
            raise SpecError(field, f"holds {len(value)} items, where the fuzzer writes {low} to {high()}")
        return tuple(check(f"{field}[{i}]", item) for i, item in enumerate(value))

    return inner


def _eps(field: str, value: Any) -> Any:
    """None, a float the generator draws (``[min, max]`` of its choices, random draws included, or a bad eps)."""
    if value is None:
        return None
    if type(value) not in (int, float):
        raise SpecError(field, f"{_show(value)} is not a number")
    finite = [v for v in (*gen.EPS_CHOICES, *gen.BAD_EPS) if math.isfinite(v)]
    if math.isfinite(value) and not min(finite) <= value <= max(gen.EPS_CHOICES):
        raise SpecError(field, f"{value!r} is outside {min(finite)!r}..{max(gen.EPS_CHOICES)!r}")
    return float(value)


def _dtypes() -> tuple:
    return sp.DTYPES


def _cast_dtypes() -> tuple:
    return (*sp.DTYPES, sp.INPUT_DTYPE)


def _seeds() -> int:
    return gen.SEEDS - 1


# --- the dataclasses ----------------------------------------------------------------------------------


def nested(cls: type) -> Check:
    def check(field: str, value: Any) -> Any:
        return _build(cls, field, value)

    return check


_FIELDS: dict[type, dict[str, Check]] = {
    sp.CastSpec: {
        "kind": one_of(lambda: sp.CAST_KINDS),
        "dtype": one_of(_cast_dtypes),
    },
    sp.WeightSpec: {
        "dtype": one_of(_dtypes),
        "kind": one_of(lambda: sp.WEIGHT_KINDS),
        "shape": one_of(lambda: sp.WEIGHT_SHAPES),
        "offset": boolean,
        "cast": optional(nested(sp.CastSpec)),
        "left": boolean,
        "around": number_in(lambda: gen.AROUNDS),
        "seed": integer(lambda: 0, _seeds),
    },
    sp.NormSpec: {
        "form": one_of(lambda: sp.FORMS),
        "pre": sequence(nested(sp.CastSpec), 0, lambda: MAX_CASTS),
        "var_pre": sequence(nested(sp.CastSpec), 0, lambda: MAX_CASTS),
        "square": one_of(lambda: sp.SQUARES + sp.NEAR_MISS_SQUARES),
        "dims": integer(lambda: 1, lambda: gen.MAX_NORMALIZED_DIMS),
        "mean_dims": optional(sequence(integer(lambda: -max(gen.RANKS) - 1, lambda: max(gen.RANKS)), 1,
                                       lambda: gen.MAX_NORMALIZED_DIMS)),
        "keepdim": boolean,
        "eps": _eps,
        "eps_how": one_of(lambda: sp.EPS_HOWS + sp.NEAR_MISS_EPS_HOWS),
        "eps_dtype": one_of(_dtypes),
        "inverse": one_of(lambda: sp.INVERSES),
        "dims_style": one_of(lambda: sp.DIMS_STYLES),
        "scaled": one_of(lambda: sp.SCALED),
        "rounded_via": one_of(_dtypes),
        "scale_left": boolean,
        "mid": sequence(nested(sp.CastSpec), 0, lambda: MAX_CASTS),
        "weight": optional(nested(sp.WeightSpec)),
        "post": sequence(nested(sp.CastSpec), 0, lambda: MAX_CASTS),
        "groups": integer(lambda: 1, lambda: max(gen.DIVISORS)),
        "also_return_normalized": boolean,
    },
    sp.Tail: {
        "kind": one_of(lambda: sp.TAIL_KINDS),
        "dtype": one_of(_dtypes),
        "value": number_in(lambda: gen.TAIL_VALUES),
        "seed": integer(lambda: 0, _seeds),
    },
    sp.CaseSpec: {
        "seed": integer(lambda: -_INT64, lambda: _INT64 - 1),
        "index": integer(lambda: 0, lambda: _INT64 - 1),
        "shape": sequence(integer(lambda: 1, lambda: max(gen.LAST_DIMS)), min(gen.RANKS), lambda: max(gen.RANKS)),
        "dtype": one_of(_dtypes),
        "norm": nested(sp.NormSpec),
        "channels_last": boolean,
        "scale": number_in(lambda: gen.SCALES + gen.FLOAT16_SCALES),
        "zero_row": boolean,
        "residual": boolean,
        "feed": optional(nested(sp.NormSpec)),
        "heads": integer(lambda: 1, lambda: max(gen.DIVISORS)),
        "heads_view": one_of(lambda: sp.HEADS_VIEWS),
        "tails": sequence(nested(sp.Tail), 0, lambda: max(gen.TAIL_COUNTS)),
        "return_input": boolean,
        "near_miss": optional(one_of(lambda: sp.NEAR_MISSES)),
        "input_seed": integer(lambda: 0, lambda: gen.INPUT_SEEDS - 1),
    },
}


def _build(cls: type, field: str, value: Any) -> Any:
    """``cls`` from the dict ``to_dict`` wrote for it, every field checked; a missing field takes its default."""
    if not isinstance(value, dict):
        raise SpecError(field, f"{_show(value)} is not a {sp.SPEC_NAMES[cls]}")
    if value.get("__type__") != sp.SPEC_NAMES[cls]:
        raise SpecError(f"{field}.__type__", f"{_show(value.get('__type__'))} where the fuzzer writes {sp.SPEC_NAMES[cls]!r}")
    checks = _FIELDS[cls]
    names = {f.name for f in dataclasses.fields(cls)}
    for name in value:
        if name != "__type__" and name not in names:
            raise SpecError(f"{field}.{_show(name) if not isinstance(name, str) else name}",
                            f"{sp.SPEC_NAMES[cls]} has no such field")
    missing = names - set(checks)
    if missing:  # a field added to the spec without a check here: refuse rather than render it unchecked
        raise SpecError(f"{field}.{sorted(missing)[0]}", "a field this version cannot check")
    for f in dataclasses.fields(cls):
        if f.name not in value and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SpecError(f"{field}.{f.name}", f"missing: a {sp.SPEC_NAMES[cls]} always has it")
    kwargs = {name: checks[name](f"{field}.{name}", item) for name, item in value.items() if name != "__type__"}
    return cls(**kwargs)


# --- relations between fields -------------------------------------------------------------------------


def _relations(field: str, case: sp.CaseSpec) -> None:
    """What the renderer relies on beyond single fields: a split divides the width it splits, a leading dim
    is one the generator draws, a channels-last input has a rank with that layout. (Other combinations the
    shrinker makes, such as a rank it lowered under a mean's dims, render and fail in torch; the replay
    then says the case ran no check.)"""
    width = case.shape[-1]
    if any(d > max(gen.LEAD_DIMS) for d in case.shape[:-1]):
        raise SpecError(f"{field}.shape", f"{list(case.shape)}: a leading dim above {max(gen.LEAD_DIMS)}")
    if case.heads > 1 and (case.heads not in gen.DIVISORS or width % case.heads):
        raise SpecError(f"{field}.heads", f"{case.heads} heads do not split a last dim of {width}")
    if case.channels_last and len(case.shape) not in (4, 5):
        raise SpecError(f"{field}.channels_last", f"a rank-{len(case.shape)} input has no channels-last layout")
    for name, norm, shape in (("norm", case.norm, case.norm_shape), ("feed", case.feed, case.shape)):
        if norm is None:
            continue
        if norm.grouped:
            if norm.groups not in gen.DIVISORS or shape[-1] % norm.groups:
                raise SpecError(f"{field}.{name}.groups", f"{norm.groups} groups do not split a last dim of {shape[-1]}")
        elif norm.groups != 1:
            raise SpecError(f"{field}.{name}.groups", f"{norm.groups} groups on a {norm.form!r} norm, which has none")


def cases(data: Any) -> list[sp.CaseSpec]:
    """The cases of a reproducer's ``SPEC`` literal, each field checked; raises :class:`SpecError`."""
    if not isinstance(data, (tuple, list)):
        raise SpecError("SPEC", f"{_show(data)} is not a list of cases")
    if not 1 <= len(data) <= MAX_CASES:
        raise SpecError("SPEC", f"holds {len(data)} cases, where the fuzzer writes 1 to {MAX_CASES}")
    out = []
    for i, item in enumerate(data):
        case = _build(sp.CaseSpec, f"SPEC[{i}]", item)
        _relations(f"SPEC[{i}]", case)
        out.append(case)
    return out
