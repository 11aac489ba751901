"""Cases in units: several cases side by side in one module, exported and lowered once.

``to_edge`` costs about a second per call whatever the graph's size, so a unit of cases (a ``Batch``
module, see :mod:`edgefuse.fuzz.render`) is exported once per mode and each check runs on all of its
cases. Whenever a unit fails as a whole (an export error, an exception from the pass, a program that no
longer runs), its cases are re-run one by one, so that every finding and every unexportable case names
one case; a failure that shows only side by side is reported against the whole unit.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Sequence

from torch.export import export

from edgefuse.fuzz.check import CaseResult, Finding, UnitFailure, merge, run_check
from edgefuse.fuzz.edge_programs import to_edge_program
from edgefuse.fuzz.render import build
from edgefuse.fuzz.spec import CaseSpec
from edgefuse.core.verify import outputs


@dataclass
class UnitTimes:
    """Seconds spent in each step, each counted once (a re-run of a failing unit's cases included)."""

    build: float = 0.0
    export: float = 0.0
    to_edge: float = 0.0
    checks: float = 0.0
    xnnpack: float = 0.0
    hostile: float = 0.0

    def add(self, other: "UnitTimes") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def run_unit(
    specs: Sequence[CaseSpec], checks: Sequence[tuple[str, str, bool]], timing: UnitTimes | None = None
) -> list[CaseResult]:
    """Run ``checks`` on the cases side by side; cases of a failing unit are re-run alone."""
    timing = timing if timing is not None else UnitTimes()
    results = [CaseResult(spec) for spec in specs]
    alone = len(specs) == 1

    def split(which: Sequence[tuple[str, str, bool]] = checks) -> list[CaseResult]:
        return [r for spec in specs for r in run_unit([spec], which, timing)]

    t0 = time.perf_counter()
    try:
        built = build(specs)
        eager = outputs(built.module, built.inputs)
    except Exception as error:  # noqa: BLE001
        timing.build += time.perf_counter() - t0
        if not alone:
            return split()
        results[0].unexportable = f"eager: {error!r}"
        return results
    t1 = time.perf_counter()
    timing.build += t1 - t0
    try:
        program = export(built.module, built.inputs)
    except Exception as error:  # noqa: BLE001
        timing.export += time.perf_counter() - t1
        if not alone:
            return split()
        results[0].unexportable = f"export: {error!r}"[:2000]
        return results
    timing.export += time.perf_counter() - t1

    for mode in dict.fromkeys(mode for mode, _, _ in checks):
        mode_checks = [c for c in checks if c[0] == mode]
        if mode == "capture":
            base = program
        else:
            t2 = time.perf_counter()
            try:
                base = to_edge_program(program, mode)
            except Exception as error:  # noqa: BLE001
                timing.to_edge += time.perf_counter() - t2
                if not alone:
                    for res, single in zip(results, split(mode_checks)):
                        merge(res, single)
                    continue
                results[0].unexportable = f"to_edge ({mode}): {error!r}"[:2000]
                continue
            timing.to_edge += time.perf_counter() - t2
        for check in mode_checks:
            t3 = time.perf_counter()
            try:
                run_check(specs, built, eager, base, check, results)
                timing.checks += time.perf_counter() - t3
            except UnitFailure as failure:
                timing.checks += time.perf_counter() - t3
                if alone:
                    results[0].checks.append(check)
                    results[0].findings.append(Finding(failure.kind, check, failure.detail, specs[0]))
                    continue
                singles = split([check])
                for res, single in zip(results, singles):
                    merge(res, single)
                if not any(single.findings for single in singles):  # only side by side: blame the unit
                    results[0].findings.append(Finding(failure.kind, check, failure.detail, specs[0], tuple(specs)))
            except Exception:  # noqa: BLE001  (a bug of the fuzzer: reported, and the run goes on)
                timing.checks += time.perf_counter() - t3
                detail = "the fuzzer's own check raised:\n" + traceback.format_exc(limit=-6)
                results[0].findings.append(Finding("fuzzer-error", check, detail, specs[0], tuple(specs) if not alone else ()))
    return results
