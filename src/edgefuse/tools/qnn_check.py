"""The QNN model table: edgefuse beside stock through ExecuTorch's own QNN flow, compiled and run on the emulator.

``python -m edgefuse.tools.qnn_check [--models NAME,...] [--precisions fp16,16a8w] [--soc SM8650] [--seed 0] [--markdown]``

For each model (:data:`edgefuse.inputs.qnn_models.QNN_MODEL_NAMES`: ExecuTorch's own Llama whole, with and
without QK norms, head dims 32 and 64; one decoder layer of tiny Llama, Qwen3, Gemma3, OLMo2 and T5; an
attention block whose norms are whole ``nn.RMSNorm``, prefilling 16 and 128 tokens at head dims 32, 64
and 128) and
each precision, the model is lowered for the SoC with edgefuse's recomposition and with the stock one
(:mod:`edgefuse.compare.qnn_flows`), each ``.pte`` runs on the x86 HTP emulator, and one row per flow says: the
norms edgefuse found and rebuilt, the norms (rebuilt or written whole) it normalized on a ``[1, rows, D]``
view for a limit of the SoC's HTP generation, the QNN RmsNorm ops in the compiled program, whether QNN lowered it
(or the exception it raised), the max error against the reference (eager for fp16; the fake-quantized
module for quantized programs, with float eager beside it as information) and the tolerance. A quantized
row also gives that error in steps of the output's quantization (``err steps``: each program's own step),
the mean of the same output's errors in those steps (``mean err steps``) and against float eager (``mean vs
float``): the largest of thousands of values is one level more or less at one of them, the mean is steadier;
and how far its fake-quantized module itself is from float eager (``module vs float``), which tells the
error the quantization makes from the error the HTP adds to it; for a program whose module quantizes an
``rms_norm``'s output (rebuilt or written whole), its error against its module run with each ``rms_norm`` output rounding down as QNN's RmsNorm does when
ExecuTorch's builder builds it (:func:`edgefuse.qnn.emulator.rounding_down`; edgefuse's builder makes it
round to nearest: :mod:`edgefuse.qnn.visitors`), in the same steps. ``--seed N`` draws the weights and the
inputs (which a quantized program is calibrated on and checked with) from ``N``; 0 is the table of the
docs. Each
program runs once more after the other flow's program ran on other values; a result marked ``varies``
came out different (:func:`edgefuse.compare.qnn_flows.check_repeatable`: QNN read memory it did not write).

Exit status: 1 if edgefuse fails to lower a model stock lowers, a norm edgefuse rebuilt is not one
RmsNorm in QNN, or an edgefuse program is outside its tolerance or its tolerance cannot tell it apart
from a wrong one (:func:`edgefuse.compare.qnn_flows.told_apart`; stock's rows are information: its
QK-norm Llama is wrong in float16, which is what this table shows); 2 for bad options; 3 when the QNN
libraries are not set up (``edgefuse qnn setup``); 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys

if __name__ == "__main__":  # run as a command: torchao and torch log warnings as they are imported below
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()

from edgefuse.inputs.errors import CHECK_FAILED, OK, USAGE
from edgefuse.console.command import run_command

DEFAULT_PRECISIONS = ("fp16", "16a8w")
PROG = "python -m edgefuse.tools.qnn_check"
HEADER = ("model", "precision", "flow", "norms", "rebuilt", "viewed", "RmsNorm", "max err", "err steps",
          "mean err steps", "err steps, RmsNorm rounding down", "mean err steps, RmsNorm rounding down", "allowed",
          "vs float", "mean vs float", "module vs float", "result", "lowered")


def check(name: str, precision: str, soc: str, say, seed: int = 0) -> tuple[list[list[str]], list[str]]:
    """The table rows of one model in one precision (edgefuse's, then stock's), its weights and inputs drawn
    from ``seed``, and what failed."""
    from edgefuse.compare import qnn_flows
    from edgefuse.inputs.qnn_models import build_qnn_model

    module, inputs = build_qnn_model(name, seed=seed)
    programs = []
    for how in (qnn_flows.EDGEFUSE, qnn_flows.STOCK):
        program = qnn_flows.lower_qnn(module, inputs, how, soc=soc, precision=precision, say=say)
        programs.append(qnn_flows.run_and_check(program, module, inputs, say))
    say("running each program again after the other")
    qnn_flows.check_repeatable(programs, inputs)
    ours, stock = programs
    failed = []
    if not ours.lowered_ok:
        if stock.lowered_ok:
            failed.append(f"{name} {precision}: edgefuse did not lower what stock lowers: {ours.failure}")
    else:
        failed += [f"{name} {precision}: {failure}" for failure in qnn_flows.failures(ours)]
    return [_row(name, precision, ours, not failed), _row(name, precision, stock, None)], failed


def _row(name: str, precision: str, program, passed: bool | None) -> list[str]:
    if not program.lowered_ok:
        lowered = f"no: {_short(program.failure)}"
    elif not program.ran:
        lowered = f"yes; did not run: {_short(program.failure)}"
    else:
        lowered = "yes"
    if passed is None:  # stock: information
        result = "-" if not program.ran else (
            "right" if program.ok else "not told apart" if program.within and not program.told_apart else "WRONG"
        )
    else:
        result = "PASS" if passed else "FAIL"
    if program.repeatable is False:
        result += ", varies"
    return [
        name, precision, program.how,
        str(program.found) if program.how == "edgefuse" and program.lowered_ok else "-",
        str(program.rebuilt) if program.how == "edgefuse" and program.lowered_ok else "-",
        str(program.viewed) if program.how == "edgefuse" and program.lowered_ok else "-",
        str(program.rms_norms) if program.lowered_ok else "-",
        _number(program.error) if program.ran else ("did not run" if program.lowered_ok else "-"),
        _in_steps(program.error, program),
        _in_steps(program.mean_error, program),
        _in_steps(program.rounding_down_error, program),
        _in_steps(program.rounding_down_mean_error, program),
        _number(program.allowed) if program.ran else "-",
        _number(program.float_error),
        _number(program.mean_float_error, digits=4),  # the two programs' means differ in the fourth digit
        _number(program.module_float_error),
        result,
        lowered,
    ]


def _in_steps(error: float | None, program) -> str:
    """``error`` of a quantized program in steps of its output's quantization, "-" without either."""
    return f"{error / program.step:.2f}" if program.ran and program.step and error is not None else "-"


def _short(text: str | None, width: int = 90) -> str:
    text = text or ""
    return text if len(text) <= width else text[: width - 1] + "…"


def _number(value: float | None, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, "-" without it."""
    return "-" if value is None else f"{value:.{digits - 1}e}"


def markdown(header, rows) -> str:
    """A Markdown table (for the closing note)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the command on ``argv`` (default ``sys.argv[1:]``); its exit code."""
    return run_command(PROG, _main, argv)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The QNN model table: edgefuse beside stock through ExecuTorch's QNN flow, compiled, run on "
        "the x86 HTP emulator and compared with eager.",
    )
    parser.add_argument("--models", help="comma-separated (default: all)")
    parser.add_argument("--precisions", default=",".join(DEFAULT_PRECISIONS), help="comma-separated: fp16, 16a8w, 16a16w, 8a8w")
    parser.add_argument("--soc", default="SM8650", help="the Qualcomm SoC to compile for (default SM8650)")
    parser.add_argument("--seed", type=int, default=0,
                        help="draws each model's weights and inputs, the calibration's too (default 0)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    from edgefuse.inputs.qnn_models import QNN_MODEL_NAMES
    from edgefuse.tools.llm_qnn_check import checked_seed

    checked_seed(parser, args.seed)

    models = args.models.split(",") if args.models is not None else list(QNN_MODEL_NAMES)
    precisions = args.precisions.split(",")
    unknown = [m for m in models if m not in QNN_MODEL_NAMES]
    if unknown:
        print(f"unknown models {', '.join(unknown)}; known: {', '.join(QNN_MODEL_NAMES)}", file=sys.stderr)
        return USAGE
    bad = [p for p in precisions if p not in ("fp16", "16a8w", "16a16w", "8a8w")]
    if bad:
        print(f"unknown precisions {', '.join(bad)}; choose from fp16, 16a8w, 16a16w, 8a8w", file=sys.stderr)
        return USAGE
    from edgefuse.qnn.socs import soc_problem

    problems = [p for p in dict.fromkeys(soc_problem(args.soc, precision) for precision in precisions) if p]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return USAGE

    import torch

    from edgefuse.console.progress import Progress
    from edgefuse.runtime.quiet import quiet_libraries
    from edgefuse.console.tables import format_table

    quiet_libraries()
    torch.set_num_threads(1)
    say = Progress(enabled=not args.quiet)
    rows, failed = [], []
    from edgefuse.compare.qnn_flows import require_libraries

    require_libraries()
    for name in models:
        for precision in precisions:
            say(f"{name} {precision}")
            more, failures = check(name, precision, args.soc, say, args.seed)
            rows += more
            failed += failures
    print(f"QNN HTP {args.soc}, x86 emulator, seed {args.seed}; reference: eager (fp16), the fake-quantized module "
          "(quantized; 'err steps': the error in steps of the output's quantization, 'mean err steps' its mean; "
          "'vs float', 'mean vs float' and 'module vs float': the program and its module against float eager, "
          "information)")
    print(markdown(HEADER, rows) if args.markdown else format_table(HEADER, rows))
    for failure in failed:
        print(f"FAILED: {failure}")
    print("all passed" if not failed else f"{len(failed)} failed")
    return CHECK_FAILED if failed else OK


if __name__ == "__main__":
    raise SystemExit(main())
