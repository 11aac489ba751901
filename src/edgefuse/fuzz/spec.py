"""A generated case as plain data: enough to write the module back out as Python source.

Nothing here refers to edgefuse's matcher: a spec says what the model computes (which tensor is cast to
what, what is squared, averaged, scaled and multiplied), and :mod:`edgefuse.fuzz.render` turns it into
source code. The names of forms, squares and roots come from the registry of norm forms,
:mod:`edgefuse.core.forms`. Every field is a str, int, float, bool, None or a tuple of them, so a spec round-trips
through :func:`to_dict` / :func:`from_dict` (and ``repr``) and can be embedded in a reproducer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from edgefuse.core import forms as registry

#: dtype names a spec may use; "input" means the dtype of the tensor the norm reads (``x.dtype``).
DTYPES = ("float32", "float16", "bfloat16", "float64")

#: Norm forms: those of the registry (:data:`edgefuse.core.forms.FORMS`: real models and hand-written code),
#: and ExecuTorch's RMSNormCoreML, x * sqrt(D) / clamp_min(vector_norm(x), floor), which is not rms_norm.
FORMS = (*registry.FORMS, "coreml")

#: Near misses: each computes something that is not rms_norm of one tensor, so it must never be rebuilt.
NEAR_MISSES = (
    "other-scaled",  # y * rsqrt(mean(x^2) + eps): another tensor scaled
    "rounded-scaled",  # the scaled tensor is a rounded copy of the squared one
    "cube",  # mean(x.pow(3))
    "cube-mul",  # mean(x * x * x)
    "product",  # mean(x * y): a product of two tensors
    "wrong-dim",  # mean over a dim set that is not the trailing dims
    "no-keepdim",  # mean(-1) without keepdim, unsqueezed back
    "eps-input",  # eps inside the sqrt is a graph input (a runtime scalar tensor)
    "eps-row",  # eps inside the sqrt is another runtime tensor, one value per row
    "eps-vector",  # eps inside the sqrt is a constant tensor of the normalized shape
    "eps-outside",  # x / (sqrt(mean) + eps): eps outside the square root
    "bad-eps",  # eps is NaN, +-inf or negative
    "coreml",  # the CoreML form: vector_norm and clamp_min, not a mean of squares
)

#: How a cast is spelled. "to": x.to(dt); "method": x.float()/.half()/.bfloat16()/.double();
#: "type_as": x.type_as(t) with t of the target dtype; "to-contiguous": x.to(dt, memory_format=
#: torch.contiguous_format) (changes the dim order of a channels-last tensor); "to-channels-last":
#: x.to(dt, memory_format=torch.channels_last / channels_last_3d) (changes a contiguous tensor's order).
CAST_KINDS = ("to", "method", "type_as", "to-contiguous", "to-channels-last")
#: A cast's dtype may also be this: the dtype of the tensor the norm reads.
INPUT_DTYPE = "input"

#: How the norm squares (``NormSpec.square``): the registry's squares of one tensor.
SQUARES = tuple(registry.SQUARES)
#: The near misses' squares: raise to the third power or multiply two tensors.
NEAR_MISS_SQUARES = ("pow3", "mul3", "product")
#: How eps is added (``NormSpec.eps_how``): a Python float right or left of the mean, or a constant
#: 1-element tensor; the near misses add a run-time tensor, a per-row tensor, a vector, or add eps outside
#: the root.
EPS_HOWS = ("right", "left", "const")
NEAR_MISS_EPS_HOWS = ("input", "row", "vector", "outside")
#: How the root is applied (``NormSpec.inverse``): the registry's spellings, and ``1.0 / torch.sqrt(a)``,
#: a reciprocal the graph multiplies by 1.0 before it scales the tensor (so the norm stays decomposed).
INVERSES = (*registry.SPELLINGS, "one-over-sqrt")
#: How the mean's dims are written (``NormSpec.dims_style``): -1, 2, [-1], [2].
DIMS_STYLES = ("neg", "pos", "list-neg", "list-pos")
#: The tensor the norm scales (``NormSpec.scaled``): the squared one, or (near misses) another or a rounded copy.
SCALED = ("same", "other", "rounded")
#: ``WeightSpec.kind`` and ``WeightSpec.shape``.
WEIGHT_KINDS = ("param", "buffer", "input")
WEIGHT_SHAPES = ("normalized", "row")
#: ``Tail.kind``: the ops that may follow a norm.
TAIL_KINDS = ("mul-scalar", "mul-0d", "mul-tensor", "residual")
#: ``CaseSpec.heads_view``: how a QK-norm's heads are split and merged.
HEADS_VIEWS = ("view", "reshape")


@dataclass(frozen=True)
class CastSpec:
    """One cast: how it is spelled and the dtype it casts to ("input" is the norm's input dtype)."""

    kind: str
    dtype: str


@dataclass(frozen=True)
class WeightSpec:
    """The tensor a norm multiplies by.

    ``kind``: "param" (an nn.Parameter), "buffer" or "input" (a graph input: a run-time weight);
    ``shape``: "normalized" (exactly the normalized shape) or "row" (1, *normalized shape: broadcasts
    the same, but is not the normalized shape); ``offset``: Gemma's ``1.0 + w``; ``cast``: a cast of
    the weight before the offset and the multiply (Gemma's ``w.float()``); ``left``: ``w * h``.
    """

    dtype: str
    kind: str = "param"
    shape: str = "normalized"
    offset: bool = False
    cast: CastSpec | None = None
    left: bool = True
    around: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class NormSpec:
    """One norm over the trailing ``dims`` dims of its input ``x``.

    The decomposed body is ``h = pre(x)``, ``v = var_pre(h)``, ``m = mean(square(v), dims, keepdim)``,
    ``a = m + eps``, ``n = scaled * inverse(a)``, ``n = mid(n)``, ``n = w * n``, ``n = post(n)``.
    ``form`` names the template it came from: a registry form, whose fields (:attr:`grouped`,
    :attr:`functional`) change the body, or "coreml". Nothing here tests a registry form's name, so a new
    form made of existing pieces needs no edit of the fuzzer.
    """

    form: str
    pre: tuple[CastSpec, ...] = ()
    var_pre: tuple[CastSpec, ...] = ()
    square: str = "pow2"  # SQUARES | near misses: NEAR_MISS_SQUARES
    dims: int = 1  # the number of trailing dims normalized
    mean_dims: tuple[int, ...] | None = None  # near miss "wrong-dim": the dims actually averaged
    keepdim: bool = True
    eps: float | None = 1e-6  # None: no eps addition at all
    eps_how: str = "right"  # EPS_HOWS | near misses: NEAR_MISS_EPS_HOWS
    eps_dtype: str = "float32"  # the dtype of a constant (1-element) eps tensor
    inverse: str = "rsqrt"  # INVERSES
    dims_style: str = "neg"  # DIMS_STYLES
    scaled: str = "same"  # SCALED
    rounded_via: str = "float16"  # the dtype a "rounded" scaled tensor is rounded through
    scale_left: bool = False  # inverse * h instead of h * inverse
    mid: tuple[CastSpec, ...] = ()
    weight: WeightSpec | None = None
    post: tuple[CastSpec, ...] = ()
    groups: int = 1  # a grouped form's: the last dim is split into this many groups
    also_return_normalized: bool = False  # the normalized tensor is a second output (two users)

    @property
    def grouped(self) -> bool:
        """Whether the form splits the last dim into groups, each normalized (the registry's ``groups``)."""
        return is_grouped(self.form)

    @property
    def functional(self) -> bool:
        """Whether the form is one ``F.rms_norm`` call (the registry's ``functional``)."""
        entry = registry_form(self.form)
        return entry is not None and entry.functional

    @property
    def written_out(self) -> bool:
        """Whether the body writes the mean of squares and the root out: a registry form that is not
        ``F.rms_norm`` (the CoreML form is a vector norm)."""
        entry = registry_form(self.form)
        return entry is not None and not entry.functional

    @property
    def takes_a_weight(self) -> bool:
        """Whether the form is written with a weight the body multiplies by (the registry's ``weight``,
        not ``F.rms_norm``'s argument): one the generator may add back when the case has none."""
        entry = registry_form(self.form)
        return entry is not None and entry.weight is not None and not entry.functional


@dataclass(frozen=True)
class Tail:
    """An op after the norm: "mul-scalar" (a Python float), "mul-0d" (a 0-d buffer), "mul-tensor"
    (a constant of the last dim's size, as a later ``* scale``), "residual" (``+`` the norm's input)."""

    kind: str
    dtype: str = "float32"
    value: float = 2.0
    seed: int = 0


@dataclass(frozen=True)
class CaseSpec:
    """A generated module around one norm (``norm``), and its inputs.

    ``shape`` and ``dtype`` are the graph input's; ``residual`` adds a second input before anything
    else; ``feed`` is a second norm whose output feeds ``norm``; ``heads`` splits the last dim into
    ``heads`` heads before ``norm`` and merges them after it (a QK-norm); ``tails`` follow the norm.
    ``near_miss`` names what makes ``norm`` not an rms_norm (None: it is one, or may be).
    """

    seed: int
    index: int
    shape: tuple[int, ...]
    dtype: str
    norm: NormSpec
    channels_last: bool = False
    scale: float = 1.0
    zero_row: bool = False
    residual: bool = False
    feed: NormSpec | None = None
    heads: int = 1
    heads_view: str = "view"  # HEADS_VIEWS
    tails: tuple[Tail, ...] = ()
    return_input: bool = False  # the norm's input is also an output
    near_miss: str | None = None
    input_seed: int = 0

    @property
    def norm_shape(self) -> tuple[int, ...]:
        """The shape of the tensor ``norm`` reads (after the head split)."""
        if self.heads > 1:
            *lead, width = self.shape
            return (*lead, self.heads, width // self.heads)
        return self.shape

    @property
    def name(self) -> str:
        return f"s{self.seed}-c{self.index}"


def registry_form(form: str) -> registry.NormForm | None:
    """The registry's entry of ``form``; None for the CoreML form, the fuzzer's own near miss."""
    return registry.FORMS.get(form)


def is_grouped(form: str) -> bool:
    """Whether ``form`` splits the last dim into groups (the registry's ``groups`` above 1)."""
    entry = registry_form(form)
    return entry is not None and entry.groups > 1


def normalized_shape(norm: NormSpec, input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape an rms_norm rebuilt from ``norm`` must normalize over, given the shape it reads."""
    if norm.grouped:
        return (input_shape[-1] // norm.groups,)
    return tuple(input_shape[len(input_shape) - norm.dims :])


def to_dict(spec: Any) -> Any:
    """A spec as nested dicts, tuples and scalars, with a "__type__" key naming each dataclass."""
    if dataclasses.is_dataclass(spec):
        out = {"__type__": SPEC_NAMES[type(spec)]}
        for f in dataclasses.fields(spec):
            out[f.name] = to_dict(getattr(spec, f.name))
        return out
    if isinstance(spec, (list, tuple)):
        return tuple(to_dict(s) for s in spec)
    return spec


#: The name each dataclass has in a SPEC: a cast is "Cast", as reproducers have always written it.
SPEC_NAMES = {CastSpec: "Cast", WeightSpec: "WeightSpec", NormSpec: "NormSpec", Tail: "Tail", CaseSpec: "CaseSpec"}
_TYPES = {name: cls for cls, name in SPEC_NAMES.items()}


def from_dict(data: Any) -> Any:
    """The inverse of :func:`to_dict`."""
    if isinstance(data, dict) and "__type__" in data:
        cls = _TYPES[data["__type__"]]
        return cls(**{k: from_dict(v) for k, v in data.items() if k != "__type__"})
    if isinstance(data, (list, tuple)):
        return tuple(from_dict(d) for d in data)
    return data
