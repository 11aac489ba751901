"""The XNNPACK comparison that ``demo``, ``lower`` and ``bench`` share: lower, serialize, load, run, check.

One exported program is lowered stock and with edgefuse (:mod:`edgefuse.compare.stock_and_edgefuse`); each result is
serialized to ``.pte`` bytes, loaded in the released runtime (:mod:`edgefuse.runtime`) and run on the
model's inputs, and its outputs are compared with eager. A lowered program passes when its max error is
within 8 units in the last place of the output's dtype at the output's largest magnitude (the delegate
sums in another order than ATen, and a half-precision program may round each intermediate once more or
less), or when it is no worse than stock's by more than one unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from edgefuse.inputs.errors import UsageError
from edgefuse.core.fresh import fresh
from edgefuse.compare.stock_and_edgefuse import STOCK, DelegateSummary, lower_xnnpack, summarize
from edgefuse.inputs.modelspec import error_summary
from edgefuse.runtime import LoadedProgram
from edgefuse.core.verify import TOLERANCES, finite_tolerance, max_error



@dataclass
class CheckedProgram:
    """One lowered program: what it holds, its bytes, the loaded program and its errors against eager."""

    how: str
    summary: DelegateSummary
    pte: bytes
    loaded: LoadedProgram | None = None
    errors: list[float] | None = None  # per output, against eager; None until run
    #: How many of the runtime's outputs are the model's own: the runtime returns the inputs and
    #: parameters the program writes in place before them.
    user_outputs: int | None = None
    allowed: list[float] | None = None  # per output
    reference: str = "eager"  # what the outputs were compared with: "eager", or the saved "program"
    #: Per method and instruction, the module paths of what it runs (:func:`edgefuse.compare.explorer.
    #: instruction_modules`) and the lowered ``EdgeProgramManager``, when the lowering was asked for them.
    modules: dict | None = None
    manager: Any = None

    @property
    def ok(self) -> bool:
        return self.errors is not None and all(e <= a for e, a in zip(self.errors, self.allowed))

    @property
    def error(self) -> float | None:
        """The largest error over the outputs."""
        return None if self.errors is None else max(self.errors, default=0.0)

    @property
    def worst_allowed(self) -> float | None:
        """The tolerance of the output that comes closest to (or goes furthest past) its tolerance."""
        if not self.errors:
            return None
        def ratio(e: float, a: float) -> float:
            return e / a if a > 0 else (0.0 if e == 0 else float("inf"))

        return max(zip(self.errors, self.allowed), key=lambda pair: ratio(*pair))[1]


def lower_to_pte(
    program: ExportedProgram, how: str, say: Callable[[str], None] = lambda _: None, serialize: bool = True,
    modules: bool = False,
) -> CheckedProgram:
    """Lower ``program`` with ``how`` and serialize it (unless not ``serialize``, for a map alone); with
    ``modules``, keep the lowered manager and what each instruction runs, for a Model Explorer overlay.

    Raises :class:`~edgefuse.inputs.errors.Unavailable` when edgefuse's flow is unavailable, and
    :class:`~edgefuse.inputs.errors.UsageError` when ExecuTorch's own (stock) flow rejects the program: then
    there is nothing to compare edgefuse's lowering with.
    """
    say(f"lowering for XNNPACK ({how})")
    manager = _stock_step(lambda: lower_xnnpack(program, how), how, "to_edge_transform_and_lower")
    summary = summarize(manager, how)
    if not serialize:
        return CheckedProgram(how, summary, b"")
    say(f"serializing the {how} program to .pte")
    if modules:
        from edgefuse.compare.explorer import handle_modules, instruction_modules

        handles = handle_modules(manager)  # before to_executorch writes over the handles
    executorch = _stock_step(manager.to_executorch, how, "to_executorch")
    pte = _stock_step(lambda: executorch.buffer, how, "to_executorch")
    checked = CheckedProgram(how, summary, pte, user_outputs=_user_outputs(manager))
    if modules:
        checked.modules, checked.manager = instruction_modules(executorch, handles), manager
    return checked


def _user_outputs(manager) -> int:
    """How many outputs of the lowered program are the model's own."""
    specs = manager.exported_program().graph_signature.output_specs
    return sum(spec.kind == OutputKind.USER_OUTPUT for spec in specs)


def _stock_step(step: Callable[[], Any], how: str, name: str, failure: str = "rejects this program") -> Any:
    """Run one ExecuTorch step; when it fails on the stock flow, the program is one ExecuTorch itself
    rejects (a usage error). edgefuse's own flow, and a missing module, fail as they are."""
    try:
        return step()
    except ImportError:
        raise
    except Exception as error:
        if how != STOCK:
            raise
        raise UsageError(
            f"ExecuTorch's XNNPACK lowering ({name}) {failure}: {error_summary(error)}; edgefuse "
            "compares its lowering with that one, so it needs a program ExecuTorch lowers"
        ) from error


def run_and_check(
    lowered: CheckedProgram, inputs: tuple, expected: list[torch.Tensor], stock: CheckedProgram | None = None,
    reference: str = "eager",
) -> CheckedProgram:
    """Load ``lowered`` in the runtime, run it once on ``inputs`` and measure its errors against ``expected``.

    With ``stock`` (already checked), an output also passes when it is no worse than stock's by more
    than one unit in the last place.
    """
    lowered.reference = reference
    lowered.loaded = _stock_step(
        lambda: LoadedProgram(lowered.pte), lowered.how, "to_executorch",
        "writes a program the runtime cannot load",  # the error holds what the runtime logged: why
    )
    actual = lowered.loaded.run(fresh(inputs))
    if lowered.user_outputs is not None and len(actual) > lowered.user_outputs:
        actual = actual[len(actual) - lowered.user_outputs:]  # the model's own outputs come last
    if len(actual) != len(expected) or any(a.shape != e.shape or a.dtype != e.dtype for a, e in zip(actual, expected)):
        lowered.errors, lowered.allowed = [float("inf")], [0.0]
        return lowered
    lowered.errors = [max_error(e, a) for a, e in zip(actual, expected)]
    lowered.allowed = [finite_tolerance(e.dtype, e, TOLERANCES["lowered program"].ulps) for e in expected]  # 0 for integers
    if stock is not None and stock.errors is not None and len(stock.errors) == len(expected):
        lowered.allowed = [
            max(allowed, theirs + finite_tolerance(e.dtype, e, TOLERANCES["beside stock"].ulps))
            for allowed, theirs, e in zip(lowered.allowed, stock.errors, expected)
        ]
    return lowered


def flat_tensors(value) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def failed_checks_line(programs: list[CheckedProgram]) -> str | None:
    """The line that names the programs whose outputs are outside their tolerance against eager, if any."""
    failed = [lowered.how for lowered in programs if not lowered.ok]
    if not failed:
        return None
    programs_differ = "programs differ" if len(failed) > 1 else "program differs"
    reference = programs[0].reference
    return f"check failed: the {' and the '.join(failed)} {programs_differ} from {reference} by more than allowed"


def comparison_lines(stock: CheckedProgram | None, ours: CheckedProgram | None) -> list[str]:
    """Two summary lines (stock, edgefuse) with the error of each program against eager."""
    lines = []
    for lowered in (stock, ours):
        if lowered is None:
            continue
        error = "" if lowered.error is None else (
            f"; max error against {lowered.reference} {lowered.error:.2e} "
            f"({'within' if lowered.ok else 'OUTSIDE'} {lowered.worst_allowed:.2e})"
        )
        lines.append(f"  {lowered.summary.line()}{error}")
    return lines
