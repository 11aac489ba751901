"""The ``qnn-llama`` command: ExecuTorch's static-Llama QNN script with edgefuse's QNN passes, its program
checked method by method on the HTP emulator (:mod:`edgefuse.llm.static_llama`).

``edgefuse qnn-llama [--method NAME]... LLAMA_ARGS...`` hands every argument but its own to the script's
parser, runs the script compile-only in this process, and prints per method (prefill and decode, as the
script names them): the norms edgefuse decided, what its legalize pass did to each whole norm, the norms
the edge program keeps whole, the ``RmsNorm`` ops QNN compiled, and the method's run on the emulator
against the module the script lowered.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Callable

from edgefuse.inputs.errors import CHECK_FAILED, OK, Unavailable, UsageError, qnn_sdk_error

Say = Callable[[str], None]

USAGE = "edgefuse qnn-llama [--method NAME]... LLAMA_ARGS..."


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """edgefuse's own ``--method`` choices and the script's arguments, from what follows ``qnn-llama``."""
    own = argparse.ArgumentParser(prog="edgefuse qnn-llama", add_help=False, allow_abbrev=False)
    own.add_argument("--method", action="append", default=[])
    known, script = own.parse_known_args(argv)
    return known.method, script


def qnn_llama_command(args: argparse.Namespace, say: Say) -> int:
    """Run the script with edgefuse's QNN passes and print each method's report; exit 1 when a method's
    outputs on the emulator are off the module's by more than their tolerance."""
    from edgefuse.console.tables import format_table
    from edgefuse.core.legalize import KEPT, LEFT, VIEWED
    from edgefuse.llm import static_llama
    from edgefuse.qnn.sdk import QnnSdkUnavailable
    from edgefuse.runtime import MethodMissing
    from edgefuse.runtime.files import UnsafeFolder

    try:
        script_args = static_llama.parse_script_args(args.script_args)
    except static_llama.ScriptArgumentError as error:
        raise UsageError(f"{error}\nusage: {USAGE}") from error
    possible = static_llama.method_names(script_args)
    unknown = [name for name in args.methods if name not in possible]
    if unknown:
        raise UsageError(f"--method {unknown[0]}: the script's program for --model_mode {script_args.model_mode} "
                         f"has the methods {', '.join(possible)}")
    say(f"running llama.py --decoder_model {script_args.decoder_model} --soc_model {script_args.soc_model}, "
        "compile-only for the HTP emulator, with edgefuse's QNN passes")
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the script's own printing: stdout holds the report
            run = static_llama.run_script(script_args)
    except UnsafeFolder as error:
        raise UsageError(f"--artifact {script_args.artifact}: {error}") from error
    except QnnSdkUnavailable as error:
        raise qnn_sdk_error(error) from error
    except static_llama.ExtraMissing as error:
        raise Unavailable(str(error)) from error
    say(f"the script wrote {run.artifact}")
    if run.stood_in:
        print(f"not installed, not needed for this run: {', '.join(run.stood_in)}")
    print(f"{run.artifact}: {len(run.pte)} bytes of .pte, methods {', '.join(run.methods)}")
    _print_decisions(run)
    checks = []
    for name in args.methods or list(run.methods):
        say(f"running {name} on the HTP emulator")
        try:
            checks.append(static_llama.check_method(run, name))
        except MethodMissing as error:
            raise UsageError(f"--method {name}: {error}") from error
    header = ["method", "decided (rebuilt/left)", "legalized (kept/viewed/left)", "whole norms (edge)", "QNN RmsNorm", "output", "max error", "allowed", "within"]
    rows = []
    for check in checks:
        rebuilt = sum(1 for d in check.decisions if d.rebuilt)
        legalized = "/".join(str(sum(1 for n in check.legalized if n.action == a)) for a in (KEPT, VIEWED, LEFT))
        norms = [check.name, f"{rebuilt}/{len(check.decisions) - rebuilt}", legalized, check.whole_norms, check.rms_norms]
        if check.failure is not None:
            rows.append([*norms, "-", "-", "-", f"failed: {check.failure}"])
        for i, comparison in enumerate(check.comparisons):
            tolerance = check.tolerances[i] if i < len(check.tolerances) else None
            allowed = f"{comparison.allowed:.3g}" + (f" ({tolerance[1].steps:.3g} steps)" if tolerance else " (float16)")
            rows.append([*(norms if i == 0 else [""] * len(norms)), i, f"{comparison.max_error:.3g}", allowed,
                         "yes" if comparison.ok else "NO"])
    print("each method on the HTP emulator against the module the script lowered (fake-quantized when quantized):")
    print(format_table(header, rows, indent="  "))
    return OK if all(check.ok for check in checks) else CHECK_FAILED


def _print_decisions(run) -> None:
    """The norms edgefuse's recomposition decided on in each pipeline run and what the legalize pass did to
    each whole norm after it (kept, viewed or left), or that it found none."""
    runs = [r for r in run.patch.runs if r.name == "RecomposeRmsNorm"]
    decisions = [(r.pipeline, d) for r in runs for d in r.decisions]
    legalized = [(r.pipeline, n) for r in runs for n in r.legalized]
    print(f"edgefuse's recomposition ran {len(runs)} times in QNN's pipelines; norms decided: {len(decisions)}; "
          f"whole norms held to the limits: {len(legalized)}")
    for pipeline, decision in decisions:
        what = "rebuilt" if decision.rebuilt else "left"
        print(f"  {pipeline}: {decision.module_path or decision.mean} ({decision.form}): {what}, {decision.reason}")
    for pipeline, norm in legalized:
        print(f"  {pipeline}: {norm.module_path or norm.node} (whole norm): {norm.action}, {norm.reason}")
