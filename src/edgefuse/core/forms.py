"""The registry of norm forms: how each decomposed RMSNorm is written, and the label the matcher gives it.

The matcher names what it matched from :data:`ROOTS` (how the norm applies the root of ``mean + eps``)
and :func:`label` (a grouped norm, a weight). The form tests and the fuzzer build their instances from
:data:`FORMS`, the forms real models and hand-written code use, each described as data: the casts around
it, how it squares, how it writes the root, its weight. A new form is one entry here, plus the matcher
and its tests; ``tests`` check that every root the matcher labels is a form both of them build.

Source text in :data:`SQUARES` and :data:`SPELLINGS` is a fixed expression with ``{v}`` (the tensor
squared) or ``{a}`` (the mean plus eps) to fill in with a variable name, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Root:
    """How a norm applies the root of ``mean + eps``, and the label the matcher gives that.

    ``function`` is ``rsqrt`` or ``sqrt``; ``pow``, whether the root is written ``pow(m, -0.5)`` or
    ``pow(m, 0.5)`` (Gemma 3n and 4); ``applied``, how the root meets the scaled tensor: it multiplies
    it (``mul``, an rsqrt), divides it (``div``) or is inverted and multiplies it (``reciprocal``).
    """

    label: str
    function: str
    pow: bool
    applied: str


#: Every root the matcher accepts; its labels are these and no others.
ROOTS = (
    Root("rsqrt", "rsqrt", False, "mul"),
    Root("pow-rsqrt", "rsqrt", True, "mul"),
    Root("div-sqrt", "sqrt", False, "div"),
    Root("div-pow-sqrt", "sqrt", True, "div"),
    Root("reciprocal-sqrt", "sqrt", False, "reciprocal"),
    Root("reciprocal-pow-sqrt", "sqrt", True, "reciprocal"),
)

_ROOT_LABELS = {(r.function, r.pow, r.applied): r.label for r in ROOTS}


def root_label(function: str, pow: bool, applied: str) -> str:
    """The label of the root ``function`` (written as a pow or not) applied as ``applied``."""
    return _ROOT_LABELS[(function, pow, applied)]


def label(root: str, grouped: bool, weight: bool) -> str:
    """The label the matcher gives a norm: its root's, marked grouped (rule 8) and with a weight."""
    return ("grouped-" if grouped else "") + root + ("+weight" if weight else "")


def labels() -> tuple[str, ...]:
    """Every label the matcher can give: a grouped norm ends before the merge, so never with a weight
    (the full-width weight follows the merge)."""
    return tuple(label(r.label, g, w) for r in ROOTS for g, w in ((False, True), (False, False), (True, False)))


@dataclass(frozen=True)
class Spelling:
    """One way code writes a root: ``source`` of ``{a}``, the mean plus eps; ``divides`` when the
    tensor is divided by it (``h / source``), else it multiplies the tensor (``h * source``)."""

    name: str
    root: str
    source: str
    divides: bool = False


#: The spellings of each root, by name (the fuzzer's ``NormSpec.inverse``).
SPELLINGS = {
    s.name: s
    for s in (
        Spelling("rsqrt", "rsqrt", "torch.rsqrt({a})"),
        Spelling("rsqrt-method", "rsqrt", "{a}.rsqrt()"),
        Spelling("pow-neg-half", "pow-rsqrt", "{a}.pow(-0.5)"),
        Spelling("div-sqrt", "div-sqrt", "torch.sqrt({a})", divides=True),
        Spelling("div-pow-sqrt", "div-pow-sqrt", "{a} ** 0.5", divides=True),
        Spelling("reciprocal-sqrt", "reciprocal-sqrt", "torch.reciprocal(torch.sqrt({a}))"),
        Spelling("reciprocal-pow-sqrt", "reciprocal-pow-sqrt", "torch.reciprocal({a} ** 0.5)"),
    )
}

#: The squares of one tensor, by name (the fuzzer's ``NormSpec.square``).
SQUARES = {"pow2": "{v}.pow(2)", "pow2f": "{v}.pow(2.0)", "square": "torch.square({v})", "mul": "{v} * {v}"}


@dataclass(frozen=True)
class FormCast:
    """A cast as a form writes it: ``kind`` is ``to`` (``x.to(dt)``), ``method`` (``x.float()``) or
    ``type_as``; ``dtype`` is ``compute`` (the dtype the norm computes in), ``input`` (the input's),
    ``weight`` (the weight's), or ``half-weight`` (the weight's when it is float16 or bfloat16; no cast
    otherwise, as T5 writes it)."""

    kind: str
    dtype: str


@dataclass(frozen=True)
class FormWeight:
    """The weight of a form: on the left (``w * h``) or right; ``offset``, Gemma's ``1 + w``; ``cast``,
    a cast of the weight before it (Gemma's ``w.float()``); ``dtype`` is ``weight`` (its own) or
    ``input``; ``optional``, the form is written without one too; ``around``, the value it is near."""

    left: bool = True
    offset: bool = False
    cast: FormCast | None = None
    dtype: str = "weight"
    optional: bool = False
    around: float = 1.0


@dataclass(frozen=True)
class NormForm:
    """One form: ``h = pre(x)``, ``m = mean(square(var_pre(h)))``, ``n = h * root(m + eps)`` (``eps_left``:
    ``eps + m``; ``scale_left``: ``root * h``), ``n = mid(n)``, the weight, ``post(n)``; ``groups`` > 1
    splits the last dim (Mamba2); ``functional`` is ``F.rms_norm``, which edge graphs decompose."""

    name: str
    seen_in: str
    pre: tuple[FormCast, ...] = ()
    var_pre: tuple[FormCast, ...] = ()
    square: str = "pow2"
    spelling: str = "rsqrt"
    eps_left: bool = False
    scale_left: bool = False
    mid: tuple[FormCast, ...] = ()
    weight: FormWeight | None = FormWeight()
    post: tuple[FormCast, ...] = ()
    groups: int = 1
    functional: bool = False

    @property
    def root(self) -> Root:
        return next(r for r in ROOTS if r.label == SPELLINGS[self.spelling].root)

    @property
    def label(self) -> str:
        """The label the matcher gives this form (with its weight, unless it is grouped: see :func:`labels`)."""
        return label(self.root.label, self.groups > 1, self.weight is not None and self.groups == 1)

    @property
    def computes_in_input_dtype(self) -> bool:
        """Whether the norm computes in its input's dtype: no cast to the compute dtype before the root."""
        return not any(c.dtype == "compute" for c in (*self.pre, *self.var_pre))


_UP, _BACK = FormCast("to", "compute"), FormCast("to", "input")
_FLOAT = FormCast("method", "compute")

#: The forms of real models (transformers 5.23, ExecuTorch's examples) and hand-written code, by name.
FORMS = {
    f.name: f
    for f in (
        NormForm("llama", "Hugging Face Llama, Qwen2/3, Mistral, Phi-3, SmolLM", pre=(_UP,), mid=(_BACK,)),
        NormForm(
            "executorch-llama", "ExecuTorch's Llama example: x * x, .float(), type_as", pre=(_FLOAT,), square="mul",
            mid=(FormCast("type_as", "input"),), weight=FormWeight(left=False),
        ),
        NormForm(
            "t5", "T5: the variance of a float32 copy scales the original x", var_pre=(_UP,),
            mid=(FormCast("to", "half-weight"),),
        ),
        NormForm("olmo2", "OLMo2: the weight applied in float32, one cast after it", pre=(_UP,), post=(_BACK,)),
        NormForm(
            "gemma", "Gemma 1/2/3: * (1 + w.float()), cast at the end", pre=(_FLOAT,),
            weight=FormWeight(left=False, offset=True, cast=_FLOAT, around=0.0), post=(FormCast("type_as", "input"),),
        ),
        NormForm(
            "gemma3n", "Gemma 3n and 4: the root as pow(m, -0.5)", pre=(_FLOAT,), spelling="pow-neg-half",
            weight=FormWeight(left=False, cast=_FLOAT), post=(FormCast("type_as", "input"),),
        ),
        NormForm(
            "scaleless", "ExecuTorch's ScalelessRMSNorm: no weight", pre=(_FLOAT,), weight=None,
            post=(FormCast("type_as", "input"),),
        ),
        NormForm(
            "unit-offset", "ExecuTorch's RMSNorm(add_unit_offset=True): * (1 + w) after type_as", pre=(_FLOAT,),
            mid=(FormCast("type_as", "input"),), weight=FormWeight(left=False, offset=True, dtype="input", around=0.0),
        ),
        NormForm("div-sqrt", "by hand: x / sqrt(mean + eps)", square="pow2f", spelling="div-sqrt"),
        NormForm("div-pow-sqrt", "by hand: x / (mean + eps) ** 0.5", spelling="div-pow-sqrt"),
        NormForm(
            "reciprocal-sqrt", "by hand: x * reciprocal(sqrt(square(x).mean + eps))", square="square",
            spelling="reciprocal-sqrt", weight=FormWeight(left=False),
        ),
        NormForm(
            "reciprocal-pow-sqrt", "by hand: x * reciprocal((mean + eps) ** 0.5)", spelling="reciprocal-pow-sqrt",
            weight=FormWeight(left=False),
        ),
        NormForm("rsqrt-method", "by hand: x * (mean + eps).rsqrt()", spelling="rsqrt-method", weight=FormWeight(left=False)),
        NormForm(
            "rsqrt-left", "by hand: rsqrt(eps + mean) * x", eps_left=True, scale_left=True, weight=FormWeight(left=False),
        ),
        NormForm(
            "functional", "torch.nn.functional.rms_norm", weight=FormWeight(dtype="input", optional=True),
            functional=True,
        ),
        NormForm("grouped", "Mamba2's gated norm: groups normalized, merged back", pre=(_UP,), mid=(_BACK,), groups=2),
    )
}
