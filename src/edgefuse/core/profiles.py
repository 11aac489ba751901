"""Backend profiles: what each target ``rms_norm`` accepts, as data the passes read."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from edgefuse.core._fx import dtype_name

_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

#: The precisions a :class:`ShapeLimit` may hold for: a norm in a graph about to be quantized, and any other.
QUANTIZED = "quantized"
FLOAT = "float"
#: What edgefuse does with a norm a :class:`ShapeLimit` covers: rebuild it on a ``[1, rows, D]`` view of
#: its input (then view the result back; such a view has no dims before the last two but a 1, so a limit
#: with ``min_outer`` above 1 never covers it), or leave it decomposed.
REMEDIES = ("rows", "leave")


@dataclass(frozen=True)
class ShapeLimit:
    """Input shapes for which a backend's ``rms_norm`` computes wrong values, as measured on the backend.

    It covers an input whose rank is in ``ranks``, whose last dim is at most ``max_last_dim`` (None: any), and whose
    dims before the last two multiply to at least ``min_outer``, when the backend computes the norm in one
    of ``precisions`` (:data:`FLOAT`, :data:`QUANTIZED`). ``remedy`` says what edgefuse does then (one of
    :data:`REMEDIES`); ``measured`` says what was seen, for the decision's reason or note.
    """

    name: str
    ranks: frozenset[int]
    max_last_dim: int | None
    min_outer: int
    precisions: frozenset[str]
    remedy: str
    measured: str

    def covers(self, shape: tuple[int | None, ...]) -> bool:
        """Whether an input of ``shape`` may be one this limit is about (a dim not known when the program
        is built, None, may be any size)."""
        last, most = shape[-1] if shape else None, self.max_last_dim
        if len(shape) not in self.ranks or (last is not None and most is not None and last > most):
            return False
        outer = shape[:-2]
        return None in outer or math.prod(outer) >= self.min_outer


@dataclass(frozen=True)
class BackendProfile:
    """What one backend's ``rms_norm`` takes.

    ``dtypes`` are the norm dtypes it runs outside quantization capture and ``capture_dtypes`` those it
    takes while a captured graph is about to be quantized; ``one_dtype`` asks the weight to share the
    norm's dtype; ``constant_weight`` asks for a weight known when the program is built;
    ``last_dim_only`` says it normalizes over the last dim alone, never over several trailing dims;
    ``limits`` are the input shapes it computes wrong (:class:`ShapeLimit`); ``lifts_scalars`` says its
    pipelines lift every scalar operand into a constant tensor (so a ``pow`` by a constant tensor stands
    for the model's number) and it computes the whole norm in its own arithmetic.
    """

    name: str
    dtypes: frozenset[torch.dtype]
    capture_dtypes: frozenset[torch.dtype]
    one_dtype: bool
    constant_weight: bool
    last_dim_only: bool = False
    limits: tuple[ShapeLimit, ...] = ()
    lifts_scalars: bool = False

    def limit_for(self, shape: tuple[int | None, ...], quantization_capture: bool) -> ShapeLimit | None:
        """The limit that covers a norm over an input of ``shape``, or None; a graph about to be quantized
        computes its norms in :data:`QUANTIZED`, any other in :data:`FLOAT`."""
        precision = QUANTIZED if quantization_capture else FLOAT
        return next((l for l in self.limits if precision in l.precisions and l.covers(shape)), None)

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


#: What QNN's HTP computes wrong or rejects, measured on QNN 2.51's x86 HTP emulator (SM8650) through
#: ExecuTorch 1.5.1's QNN flow; ``tests/qnn/test_qnn_limits.py`` holds each to that emulator, so a QNN that
#: fixes one fails a test there.
QNN_LIMITS = (
    ShapeLimit(
        name="htp-fp16-rms-norm-layout",
        ranks=frozenset({3, 4}),
        max_last_dim=32,
        min_outer=2,
        precisions=frozenset({FLOAT}),
        remedy="rows",
        measured=(
            "in float16 the HTP returns wrong values for some inputs of rank 3 or 4 with a last dim of 32 "
            "or less whose dims before the last two are not all 1 (as [1, 16, 4, 32], [2, 16, 32]), and "
            "right ones for every [1, rows, D] measured"
        ),
    ),
    ShapeLimit(
        name="htp-rms-norm-rank",
        ranks=frozenset(range(5, 9)),
        max_last_dim=None,
        min_outer=1,
        precisions=frozenset({FLOAT, QUANTIZED}),
        remedy="rows",
        measured="the HTP takes no rms_norm of rank above 4, and a program that holds one does not lower",
    ),
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
