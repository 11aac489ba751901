"""Backend profiles: what each target ``rms_norm`` accepts, as data the passes read."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Union

import torch
from torch.fx import Node

from edgefuse.core._fx import dtype_name
from edgefuse.core.precisions import FLOAT, PRECISIONS, QUANTIZED, QUANTIZED_PRECISIONS

__all__ = ["FLOAT", "PRECISIONS", "QUANTIZED", "QUANTIZED_PRECISIONS"]  # the names, read from core.precisions

_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

#: The precision of a graph's norms: one name of :data:`PRECISIONS` for all, or a function that gives a
#: norm's node its own (a quantizer that quantizes some modules at another precision).
Precision = Union[str, Callable[[Node], str]]


def check_precision(name: object) -> str:
    """``name`` when it is one of :data:`PRECISIONS`; a ValueError that lists them otherwise."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}: edgefuse knows {', '.join(PRECISIONS)}")
    return name


def precision_of(precision: Precision, node: Node) -> str:
    """The precision ``node``'s norm is computed in under ``precision``, checked."""
    return check_precision(precision(node) if callable(precision) else precision)
#: What edgefuse does with a norm a :class:`ShapeLimit` covers: rebuild it on a ``[1, rows, D]`` view of
#: its input (then view the result back; such a view has no dims before the last two but a 1, so a limit
#: with ``min_outer`` above 1 never covers it), or leave it decomposed.
REMEDIES = ("rows", "leave")


@dataclass(frozen=True)
class ShapeLimit:
    """Input shapes for which a backend's ``rms_norm`` computes wrong values, as measured on the backend.

    It covers an input whose rank is in ``ranks``, whose last dim is at most ``max_last_dim`` (None: any), and whose
    dims before the last two multiply to at least ``min_outer``, when the backend computes the norm in one
    of ``precisions`` (names of :data:`PRECISIONS`). ``remedy`` says what edgefuse does then (one of
    :data:`REMEDIES`); ``measured`` says what was seen, for the decision's reason or note. ``right`` are
    the precisions measured right on the shapes it covers, each with the hardware generations it was
    measured on; for any other precision it does not hold for (one not measured, or :data:`QUANTIZED`, a
    precision not known), and for a ``right`` one on another generation, ``unremedied`` says what was
    measured on those shapes, which edgefuse then does not remedy (empty: nothing).
    """

    name: str
    ranks: frozenset[int]
    max_last_dim: int | None
    min_outer: int
    precisions: frozenset[str]
    remedy: str
    measured: str
    unremedied: str = ""
    right: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def right_on(self, precision: str) -> tuple[str, ...]:
        """The generations ``precision`` was measured right on, on the shapes this limit covers (none: it
        was not measured right anywhere)."""
        return next((where for name, where in self.right if name == precision), ())

    def covers(self, shape: tuple[int | None, ...]) -> bool:
        """Whether an input of ``shape`` may be one this limit is about (a dim not known when the program
        is built, None, may be any size)."""
        last, most = shape[-1] if shape else None, self.max_last_dim
        if len(shape) not in self.ranks or (last is not None and most is not None and last > most):
            return False
        outer = shape[:-2]
        return None in outer or math.prod(outer) >= self.min_outer


@dataclass(frozen=True)
class Generation:
    """One hardware generation of a backend as measured on ``chips``: the names of the limits measured
    there, and of those seen to hold. A limit not measured there is held, as on a generation not measured."""

    name: str
    chips: tuple[str, ...]
    measured: frozenset[str]
    holds: frozenset[str]


@dataclass(frozen=True)
class Refusal:
    """A chip for which the backend does not compile an ``rms_norm`` in ``precision`` (:data:`FLOAT`,
    :data:`QUANTIZED`), as measured; ``why`` is what failed."""

    chip: str
    precision: str
    why: str

    @property
    def measured(self) -> str:
        return f"QNN 2.51 does not compile an RmsNorm in {self.precision} for {self.chip} ({self.why})"


@dataclass(frozen=True)
class BackendProfile:
    """What one backend's ``rms_norm`` takes.

    ``dtypes`` are the norm dtypes it runs outside quantization capture and ``capture_dtypes`` those it
    takes while a captured graph is about to be quantized; ``one_dtype`` asks the weight to share the
    norm's dtype; ``constant_weight`` asks for a weight known when the program is built;
    ``last_dim_only`` says it normalizes over the last dim alone, never over several trailing dims;
    ``limits`` are the input shapes it computes wrong (:class:`ShapeLimit`); ``lifts_scalars`` says its
    pipelines lift every scalar operand into a constant tensor (so a ``pow`` by a constant tensor stands
    for the model's number) and it computes the whole norm in its own arithmetic; ``generations`` are the
    hardware generations measured and the limits of each, ``refusals`` the chips it does not compile a
    norm for in some precision.
    """

    name: str
    dtypes: frozenset[torch.dtype]
    capture_dtypes: frozenset[torch.dtype]
    one_dtype: bool
    constant_weight: bool
    last_dim_only: bool = False
    limits: tuple[ShapeLimit, ...] = ()
    lifts_scalars: bool = False
    generations: tuple[Generation, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    #: The hardware generation this profile's limits were picked for (:meth:`for_generation`), or None.
    target: str | None = None

    def generation(self, name: str | None) -> Generation | None:
        """The measured generation called ``name``, or None when it was not measured."""
        return next((g for g in self.generations if g.name == name), None)

    def for_generation(self, name: str | None) -> BackendProfile:
        """This profile with the limits of the generation ``name``: those seen to hold there and those not
        measured there; a generation not measured (or None) keeps every limit, the union of what the
        measured generations hold."""
        measured = self.generation(name)
        if measured is None:
            return replace(self, target=name)
        kept = tuple(l for l in self.limits if l.name in measured.holds or l.name not in measured.measured)
        return replace(self, limits=kept, target=name)

    def refusal(self, chip: str, precision: str) -> Refusal | None:
        """Why this backend does not compile a norm for ``chip`` in ``precision``, or None."""
        return next((r for r in self.refusals if r.chip == chip and r.precision == precision), None)

    def limit_for(self, shape: tuple[int | None, ...], precision: str) -> ShapeLimit | None:
        """The limit that covers a norm over an input of ``shape`` computed in ``precision`` (one of
        :data:`PRECISIONS`), or None."""
        return next((l for l in self.limits if precision in l.precisions and l.covers(shape)), None)

    def unremedied(self, shape: tuple[int | None, ...], precision: str) -> str | None:
        """What was measured wrong for a norm over ``shape`` in ``precision`` that no limit held there
        remedies, or None: a norm no limit covers is not thereby one the backend computes right."""
        found = next(
            (l for l in self.limits if l.unremedied and l.covers(shape) and precision not in l.precisions
             and self.target not in l.right_on(precision)),
            None,
        )
        if found is None:
            return None
        right_on = found.right_on(precision)
        target = self.target or "a generation not named (no SoC given)"
        unknown = "the precision it is quantized at was not known to edgefuse" if precision == QUANTIZED else (
            f"{precision} was measured right on these shapes on {', '.join(right_on)} only, not on {target}"
            if right_on else f"{precision} was not measured on these shapes"
        )
        return f"{found.name}: {unknown}, and {found.unremedied}"

    def dtype_reason(self, dtype: torch.dtype, quantization_capture: bool) -> str | None:
        """Why this backend cannot take a norm in ``dtype``, or None when it can."""
        allowed = self.capture_dtypes if quantization_capture else self.dtypes
        if dtype in allowed:
            return None
        where = "during quantization capture" if quantization_capture else "outside quantization capture"
        names = ", ".join(sorted(dtype_name(d) for d in allowed))
        return f"{self.name} has no {dtype_name(dtype)} rms_norm {where} (it takes {names})"

    def shape_reason(self, normalized_shape: tuple[int, ...]) -> str | None:
        """Why this backend cannot normalize over ``normalized_shape``, or None when it can."""
        if self.last_dim_only and len(normalized_shape) > 1:
            return (
                f"{self.name}'s rms_norm normalizes over the last dim only, and this norm normalizes over "
                f"{list(normalized_shape)}"
            )
        return None


#: What QNN's HTP computes wrong or rejects, measured on QNN 2.51's x86 HTP emulator through ExecuTorch
#: 1.5.1's QNN flow (``python -m edgefuse.tools.qnn_sweep``; docs/qnn-limits.md has the plans and counts);
#: ``tests/qnn/test_qnn_limits.py`` holds each to that emulator, so a QNN that fixes one fails a test there.
#: A quantized norm is viewed during capture, before the quantizer annotates it: the quantizer has a view
#: share its input's encoding, so the view's quantize/dequantize pair rounds nothing.
QNN_LIMITS = (
    ShapeLimit(
        name="htp-fp16-rms-norm-layout",
        ranks=frozenset({3, 4}),
        max_last_dim=None,
        min_outer=2,
        precisions=frozenset({FLOAT, "8a8w", "8a4w"}),
        remedy="rows",
        measured=(
            "in float16 the HTP returns wrong values for inputs of rank 3 or 4 whose dims before the last two "
            "are not all 1, at last dims from 1 to 512 (as [9, 1, 40], [2, 16, 32], [1, 12, 20, 64], "
            "[10, 32, 200]): 895 of 4,099 norms measured on SM8650 were wrong, each with those dims "
            "multiplying to 2 or more, and none of the 583 measured as [rows, D], [1, rows, D] or "
            "[1, 1, rows, D]; the wrong region within them fits no simpler rule, so only [1, rows, D] is "
            "trusted; at 8a8w the same shapes are wrong (39 of 327 norms on SM8650, the same 49 of 117 on "
            "V79 and V69 as in float16, by 92 to 255 steps of the output's encoding; measured on V75, V79 and "
            "V69 only); 8a4w is held alike, not measured: QNN annotates its norm with 8-bit activations as at 8a8w"
        ),
        unremedied=(
            "at 8a8w QNN was measured wrong on these shapes (39 of 327 norms on SM8650, the same 49 of 117 on "
            "V79 and V69 as in float16), so edgefuse views a norm there when it is told the precision; "
            "16a4w was measured right on V75 and V79, 16a8w and 16a16w on V75 only"
        ),
        right=(("16a4w", ("V75", "V79")), ("16a8w", ("V75",)), ("16a16w", ("V75",))),
    ),
    ShapeLimit(
        name="htp-rms-norm-rank",
        ranks=frozenset(range(5, 9)),
        max_last_dim=None,
        min_outer=1,
        precisions=frozenset(PRECISIONS),
        remedy="rows",
        measured="the HTP takes no rms_norm of rank above 4, and a program that holds one does not lower",
    ),
)

#: The HTP generations measured, on which chips, and the limits measured there: 117 float16 norms ran on
#: each chip and each got the same 49 of them wrong; a rank-5 norm at fp16 and 16a8w on each chip.
_LAYOUT, _RANK = (limit.name for limit in QNN_LIMITS)
QNN_GENERATIONS = tuple(
    Generation(name=arch, chips=(chip,), measured=frozenset(names), holds=frozenset(names))
    for arch, chip, names in (
        ("V68", "SA8295", (_LAYOUT, _RANK)),
        ("V69", "SM8450", (_LAYOUT, _RANK)),
        ("V73", "SM8550", (_LAYOUT, _RANK)),
        ("V75", "SM8650", (_LAYOUT, _RANK)),
        ("V79", "SM8750", (_LAYOUT, _RANK)),
        ("V81", "SM8850", (_LAYOUT, _RANK)),
    )
)

#: The chips whose float16 RmsNorm QNN 2.51 does not compile, one norm of [1, 8, 64] tried on each chip
#: ExecuTorch 1.5.1 knows (16a8w compiled on every one).
QNN_REFUSALS = tuple(
    Refusal(chip, FLOAT, why)
    for chip, why in (
        ("QCM6490", "its op validation refuses it"),
        ("SAR2230P", "its op validation refuses it"),
        ("SM8350", "making the context binary fails"),
        ("SSG2115P", "its op validation refuses it"),
        ("SSG2125P", "its op validation refuses it"),
        ("SW6100", "its op validation refuses it"),
        ("SXR1230P", "its op validation refuses it"),
    )
)

PROFILES: dict[str, BackendProfile] = {
    "aten": BackendProfile(
        name="aten",
        dtypes=_FLOATS,
        capture_dtypes=_FLOATS,
        one_dtype=False,
        constant_weight=False,
    ),
    # QNN's RmsNorm takes one dtype for input, weight and output; bfloat16 only as a graph about to be
    # quantized, since the HTP has no bfloat16 float type. The released op builder
    # (backends/qualcomm/builders/op_rms_norm.py) normalizes over the last dim whatever normalized_shape
    # says, or drops the node, so a norm over several trailing dims would compute another function there.
    # QNN's export passes lift scalar operands into constant tensors (``pow(x, 2)`` reaches its graphs as
    # ``pow.Tensor_Tensor`` of a lifted 2).
    "qnn": BackendProfile(
        name="qnn",
        dtypes=frozenset({torch.float16, torch.float32}),
        capture_dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
        one_dtype=True,
        constant_weight=True,
        last_dim_only=True,
        limits=QNN_LIMITS,
        lifts_scalars=True,
        generations=QNN_GENERATIONS,
        refusals=QNN_REFUSALS,
    ),
}


def get_profile(backend: str | BackendProfile) -> BackendProfile:
    """The profile named ``backend`` (or ``backend`` itself); a ValueError lists the known names."""
    if isinstance(backend, BackendProfile):
        return backend
    try:
        return PROFILES[backend]
    except (KeyError, TypeError):
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown backend {backend!r}: edgefuse knows {known}") from None
