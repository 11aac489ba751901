"""The XNNPACK sample: generated cases lowered with edgefuse's XNNPACK flow and run in the released runtime.

A sample of cases (``--xnnpack-every K``) is exported, lowered with :func:`edgefuse.xnnpack.lower`,
serialized to ``.pte`` bytes, loaded in ``executorch.runtime`` and run with the real XNNPACK kernels; each
output must keep eager's dtype and shape and match eager within the "lowered program" tolerance (8) units in the
last place of its dtype at its largest magnitude (the delegate sums in another order than ATen, and a
half-precision program rounds each intermediate once more or less). An output that misses that still
passes when stock ExecuTorch's lowering of the same program misses it by as much, within one more unit:
the delegate's own arithmetic, not edgefuse's rewrite. Stock is lowered only for such an output.

Findings: "xnnpack-exception" (edgefuse's lowering raised where stock's does not), "xnnpack-broken"
(the program does not load or run), "xnnpack-mismatch". A case that stock cannot lower either is
unexportable for this check, not a finding.
"""

from __future__ import annotations

import time
import traceback
from typing import Sequence

import torch
from torch.export import export

from edgefuse.fuzz.check import CaseResult, Finding, merge
from edgefuse.fuzz.render import Built, build
from edgefuse.fuzz.spec import CaseSpec
from edgefuse.fuzz.tolerance import compare_at
from edgefuse.fuzz.units import UnitTimes
from edgefuse.core.verify import outputs

XNNPACK_CHECK = ("xnnpack", "edgefuse", False)


def _run_pte(program, how: str, inputs) -> list[torch.Tensor]:
    from edgefuse.compare.pte_checks import lower_to_pte
    from edgefuse.runtime import LoadedProgram

    lowered = lower_to_pte(program, how)
    return LoadedProgram(lowered.pte).run(inputs)


class _Failure(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


def _lowered_outputs(program, inputs) -> list[torch.Tensor] | str:
    """edgefuse's ``.pte`` outputs; a str when stock cannot lower or run the program either."""
    from edgefuse.compare.pte_checks import lower_to_pte
    from edgefuse.runtime import LoadedProgram

    try:
        lowered = lower_to_pte(program, "edgefuse")
    except Exception:  # noqa: BLE001
        detail = traceback.format_exc(limit=-6)
        stock = _stock(program, inputs)
        if isinstance(stock, str):
            return stock
        raise _Failure("xnnpack-exception", "edgefuse's XNNPACK lowering raised (stock lowers this program):\n" + detail)
    try:
        return LoadedProgram(lowered.pte).run(inputs)
    except Exception:  # noqa: BLE001
        detail = traceback.format_exc(limit=-4)
        stock = _stock(program, inputs)
        if isinstance(stock, str):
            return stock
        raise _Failure("xnnpack-broken", "edgefuse's .pte does not load or run (stock's does):\n" + detail)


def _stock(program, inputs) -> list[torch.Tensor] | str:
    """Stock's ``.pte`` outputs, or why stock cannot lower or run the program."""
    try:
        return _run_pte(program, "stock", inputs)
    except Exception as error:  # noqa: BLE001
        return f"xnnpack (stock cannot lower or run it either): {error!r}"[:2000]


def _check(specs: Sequence[CaseSpec], built: Built, eager, program, results: list[CaseResult]) -> None:
    actual = _lowered_outputs(program, built.inputs)
    if isinstance(actual, str):
        for res in results:
            res.unexportable = res.unexportable or actual
        return
    if len(actual) != len(eager):
        raise _Failure("xnnpack-broken", f"the .pte returns {len(actual)} tensors, eager {len(eager)}")
    from edgefuse.core.verify import TOLERANCES

    ulps = TOLERANCES["lowered program"].ulps

    stock: list = []
    for k, (spec, res) in enumerate(zip(specs, results)):
        res.checks.append(XNNPACK_CHECK)
        sl = built.output_slices[k]
        for i, (expected, got) in enumerate(zip(eager[sl], actual[sl])):
            if got.dtype != expected.dtype or got.shape != expected.shape:
                res.findings.append(Finding(
                    "xnnpack-mismatch", XNNPACK_CHECK,
                    f"output {i} is {got.dtype} {list(got.shape)}, eager {expected.dtype} {list(expected.shape)}", spec,
                ))
                continue
            ours = compare_at(expected, got, expected.dtype, ulps)
            if ours.ok:
                continue
            if not stock:
                stock.append(_stock(program, built.inputs))
            theirs = stock[0][sl.start + i] if not isinstance(stock[0], str) else None
            if theirs is not None and theirs.shape == expected.shape and theirs.dtype == expected.dtype:
                reference = compare_at(expected, theirs, expected.dtype, ulps)
                one_more = compare_at(expected, expected, expected.dtype, TOLERANCES["beside stock"].ulps).allowed
                if ours.max_error <= reference.max_error + one_more:
                    continue
                against = f"; stock's .pte is off by {reference.max_error:.6g}"
            else:
                against = "; stock's .pte could not be compared"
            res.findings.append(Finding(
                "xnnpack-mismatch", XNNPACK_CHECK,
                f"output {i} ({expected.dtype}): edgefuse's .pte is off eager by {ours.max_error:.6g} > "
                f"{ours.allowed:.6g} allowed ({ulps:g} ulps){against}", spec,
            ))


def run_xnnpack(specs: Sequence[CaseSpec], timing: UnitTimes | None = None) -> list[CaseResult]:
    """Lower the cases side by side for XNNPACK, run the ``.pte`` and compare; re-run alone on a failure."""
    timing = timing if timing is not None else UnitTimes()
    results = [CaseResult(spec) for spec in specs]
    start = time.perf_counter()
    try:
        try:
            built = build(specs)
            eager = outputs(built.module, built.inputs)
            program = export(built.module, built.inputs)
        except Exception as error:  # noqa: BLE001  (the main check reports unexportable cases)
            if len(specs) > 1:
                return _split(specs, results, timing)
            results[0].unexportable = f"export: {error!r}"[:2000]
            return results
        try:
            _check(specs, built, eager, program, results)
        except _Failure as failure:
            if len(specs) > 1:
                return _split(specs, [CaseResult(spec) for spec in specs], timing)
            results[0].checks.append(XNNPACK_CHECK)
            results[0].findings.append(Finding(failure.kind, XNNPACK_CHECK, failure.detail, specs[0]))
        return results
    finally:
        timing.xnnpack += time.perf_counter() - start


def _split(specs: Sequence[CaseSpec], results: list[CaseResult], timing: UnitTimes) -> list[CaseResult]:
    for spec, res in zip(specs, results):
        inner = UnitTimes()
        merge(res, run_xnnpack([spec], inner)[0])
    return results
