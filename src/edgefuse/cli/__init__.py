"""The ``edgefuse`` command (also ``python -m edgefuse``): argument parsing and dispatch only.

The work is done in the modules :data:`COMMANDS` names; they are imported only once the arguments parse,
so ``edgefuse --help`` and usage errors do not wait for torch and ExecuTorch. When a command first
imports those it says what it is about to do (:class:`edgefuse.console.progress.FirstHeavyImport`): the
loading takes seconds, and a minute or two on a cold first run. Help loads neither and says nothing.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from edgefuse.console.command import run_command
from edgefuse.inputs.pt2_bounds import DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, byte_count
from edgefuse.qnn.precisions import LOWER_PRECISIONS

MODEL_HELP = (
    "a built-in model (tiny-llama, tiny-qwen3, tiny-gemma3, tiny-t5, tiny-olmo2, ...; an unknown name "
    "lists them all), path/to/file.py:function returning (module, example_inputs), or a program saved "
    "with torch.export.save (.pt2)"
)

EPILOG = """\
exit codes:
  0  done, and every check passed
  1  a check failed: a rewritten or lowered program does not match its reference
  2  bad usage or input: unknown model, a file that does not load or export, a .pt2 that would run
     code when loaded (see --trust-pickled-pt2) or is past a bound (--max-bytes, --max-seconds), a
     model ExecuTorch's to_edge or stock XNNPACK lowering rejects, a model QNN lowers neither with
     edgefuse nor stock (QNN's reason is printed), a missing .pt2, an output path that cannot be written,
     a name edgefuse chose for its own file already taken, QNN libraries in a folder another user could
     write, a .pte bench-llm refuses or that crashes the runtime in its trial (the signal is named),
     arguments llama.py refuses, a --soc_model QNN does not compile for or a --method the program lacks,
     a model folder without config.json or a model optimum cannot load, an option optimum does not take
  3  a part of edgefuse the command needs is unavailable (its XNNPACK lowering, the fuzzer, QNN's
     libraries: not set up, or `edgefuse qnn setup` cannot set them up here; a package llama.py needs;
     optimum-executorch for export-hf)
  4  edgefuse itself failed (a bug: the traceback is printed)
"""

DEFAULT_SOC = "SM8650"


QNN_LLAMA = """\
Run ExecuTorch's examples/qualcomm/oss_scripts/llama/llama.py in this process, compile-only for the HTP
emulator, with edgefuse's QNN passes, and print per method the norms edgefuse decided, the norms kept whole,
the RmsNorm ops QNN compiled and the method's run on the emulator against the module the script lowered.
Every argument but --method is the script's (its --artifact folder, else one edgefuse picks).
See docs/qnn-llama.md."""

#: Every command: the module and the function that run it, imported only once the arguments parse, and
#: the line it says as it first imports torch or ExecuTorch (filled in from the arguments; None: a command
#: that loads neither up front).
COMMANDS = {
    "demo": ("edgefuse.cli.demo", "demo_command",
             "demo: building tiny-qwen3, rebuilding its norms for QNN and lowering it for XNNPACK both ways"),
    "report": ("edgefuse.cli.commands", "report_command", "report {model}: finding its norms and rebuilding them"),
    "lower": ("edgefuse.cli.commands", "lower_command", "lower {model}: lowering it for {backend} stock and with edgefuse"),
    "bench": ("edgefuse.cli.commands", "bench_command",
              "bench {model}: lowering it for XNNPACK both ways and timing the two programs"),
    "fuzz": ("edgefuse.cli.commands", "fuzz_command", "fuzz: fuzzing edgefuse's rewrites against eager"),
    "export-llm": ("edgefuse.cli.llm_commands", "export_llm_command",
                   "export-llm: running ExecuTorch's export_llm with edgefuse inside"),
    "export-hf": ("edgefuse.cli.hf_commands", "export_hf_command",
                  "export-hf {model_dir}: running optimum-executorch's export"),
    "bench-llm": ("edgefuse.cli.llm_commands", "bench_llm_command", "bench-llm: timing {stock} against {edgefuse}"),
    "qnn-llama": ("edgefuse.cli.qnn_llama", "qnn_llama_command",
                  "qnn-llama: compiling ExecuTorch's static Llama for QNN with edgefuse's passes"),
    "qnn setup": ("edgefuse.cli.qnn_setup", "run", None),  # downloads first; its self-check says when it loads torch
    "qnn env": ("edgefuse.cli.qnn_setup", "run", None),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefuse",
        description="Rebuild decomposed RMSNorm for ExecuTorch backends without moving a rounding, and "
        "keep norms inside the XNNPACK delegate.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress lines on stderr")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    commands.add_parser(
        "demo", parents=[common],
        help="tiny Qwen3: rebuild its norms for QNN, lower it for XNNPACK stock and with edgefuse",
        description="Build tiny-qwen3 with one decoder layer from its embedded config (no network), export "
        "it in float32 and float16, rebuild its norms for QNN in the captured graph, lower the float16 program "
        "for XNNPACK stock and with edgefuse, run both .pte in executorch.runtime and print the per-norm "
        "tables and the delegate counts.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    report = commands.add_parser(
        "report", parents=[common], help="one row per norm: rebuilt or not, why, and its error against eager",
        description="Find every decomposed RMSNorm in MODEL, rebuild what the backend can run without "
        "moving a rounding, and print one row per norm and a summary line.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_arguments(report)
    report.add_argument("--backend", default="qnn", help="backend profile: qnn (default) or aten")
    report.add_argument(
        "--stage", choices=("capture", "edge"), default=None,
        help="edge: the ExecuTorch edge program (default); capture: the captured ATen graph a quantizer sees "
        "(the default with --quantize)",
    )
    report.add_argument(
        "--quantize", choices=("qnn",), default=None,
        help="also quantize the captured graph for QNN after the rewrite (PT2E with the released QnnQuantizer, "
        "calibrated on the example inputs) and say per norm how it was quantized and the quantize/dequantize "
        "pairs it costs",
    )
    report.add_argument("--json", action="store_true",
                        help="print JSON that validates against edgefuse/compare/report.schema.json")
    report.add_argument("--map", metavar="SVG",
                        help="also lower MODEL for XNNPACK both ways and write the delegate map here")
    report.add_argument(
        "--compile", action="store_true",
        help="also lower MODEL with edgefuse's QNN flow (QNN's compiler, --soc, --precision) and add a column: "
        "the QNN op each norm became (RmsNorm, or the ops it stayed as); needs --backend qnn",
    )
    report.add_argument(
        "--explorer", metavar="OUT.pte",
        help="also lower MODEL for XNNPACK both ways, write edgefuse's program here and stock's as OUT.stock.pte, "
        "each with a Model Explorer overlay beside it (OUT.nodedata.json): where each norm went; see docs/explorer.md",
    )
    _qnn_arguments(report, "with --compile: ")

    lower = commands.add_parser(
        "lower", parents=[common], help="lower MODEL for XNNPACK or QNN with edgefuse to a .pte, compared with stock",
        description="Lower MODEL stock and with edgefuse, run both (XNNPACK: in executorch.runtime; QNN: on "
        "the x86 HTP emulator) and compare them with eager, print the delegates, the ops left outside and, "
        "for QNN, the norms that became QNN RmsNorm; write the edgefuse .pte and the delegate map.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_arguments(lower)
    lower.add_argument("-o", "--output", required=True, metavar="OUT.pte", help="where to write the edgefuse .pte")
    lower.add_argument("--map", metavar="SVG", help="delegate map (default: OUT.delegates.svg next to the .pte, "
                       "written only when no file or link has that name)")
    lower.add_argument("--explorer", action="store_true",
                       help="also write stock's program as OUT.stock.pte and a Model Explorer overlay beside each "
                       ".pte (OUT.nodedata.json): each instruction delegated or outside, and where each norm went; "
                       "see docs/explorer.md")
    lower.add_argument("--backend", choices=("xnnpack", "qnn"), default="xnnpack",
                       help="xnnpack (default): the CPU delegate; qnn: QNN's HTP, through ExecuTorch's own QNN flow")
    _qnn_arguments(lower, "with --backend qnn: ")

    bench = commands.add_parser(
        "bench", parents=[common], help="time stock against edgefuse XNNPACK programs in executorch.runtime",
        description="Lower MODEL both ways, check both against eager, and time them in "
        "executorch.runtime, alternating one run of each; prints medians and the ratio to stock.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_arguments(bench)
    bench.add_argument("--runs", type=int, default=200, help="timed runs of each program (default 200)")
    bench.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default runs/10)")
    bench.add_argument("--threads", type=int, default=1, help="XNNPACK threadpool size (default 1)")

    qnn = commands.add_parser(
        "qnn", help="set up QNN's libraries (its compiler and x86 HTP emulator) from a package registry",
        description="QNN's libraries for ExecuTorch's Qualcomm backend, without a QNN SDK. With one, set "
        "QNN_SDK_ROOT to it instead.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qnn_commands = qnn.add_subparsers(dest="qnn_command", metavar="QNN_COMMAND", required=True)
    qnn_setup = qnn_commands.add_parser(
        "setup", parents=[common], help="download, lay out, build and check QNN's libraries; print the environment",
        description="Fetch the onnxruntime-qnn 2.7.0 wheel (QNN 2.51) with pip download (installed nowhere; "
        "reused once downloaded), lay its libraries out as a QNN SDK root in DIR, compile the device-config "
        "wrapper with the system C compiler, compile one RmsNorm with QNN and run it on the HTP emulator "
        "against eager, and print the environment another process needs. A finished DIR is reused.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qnn_setup.add_argument("dir", nargs="?", metavar="DIR",
                           help="where to set them up (default: $XDG_CACHE_HOME or ~/.cache, then edgefuse/qnn/2.51.0)")
    qnn_setup.add_argument("--wheel", metavar="FILE",
                           help="the onnxruntime-qnn 2.7.0 wheel for this machine, downloaded elsewhere")
    qnn_env = qnn_commands.add_parser(
        "env", parents=[common], help="print the environment that gives another process the QNN libraries",
        description="Print the shell lines (QNN_SDK_ROOT, LD_LIBRARY_PATH) of the QNN libraries edgefuse "
        "uses: DIR, else QNN_SDK_ROOT, else the default set-up.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qnn_env.add_argument("dir", nargs="?", metavar="DIR", help="a folder `edgefuse qnn setup DIR` set up")
    export_llm = commands.add_parser(
        "export-llm", parents=[common],
        help="ExecuTorch's export_llm (same config, overrides and output) with edgefuse's XNNPACK lowering or QNN passes",
        description="Run ExecuTorch's export_llm (hydra config, overrides, output files) with edgefuse's XNNPACK "
        "lowering in place of stock's (for a config with backend.qnn.enabled=True, edgefuse's QNN passes in "
        "place of the stock ones), and print the delegates and the kernels left outside them, by op. "
        "Example, with ExecuTorch's llama_xnnpack.yaml, which holds no base.params or base.checkpoint (a key a "
        "config lacks takes a +): edgefuse export-llm --config llama_xnnpack.yaml +base.checkpoint=ckpt.pth "
        "+base.params=params.json",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export_llm.add_argument("--config", metavar="FILE", help="an export_llm config (LlmConfig YAML)")
    export_llm.add_argument("--compare", action="store_true",
                            help="also export with stock lowering (kept as NAME.stock.pte) and print both side by side")
    export_llm.add_argument("--single-row", default=None, metavar="POLICY",
                            choices=("delegate", "auto", "float32-portable", "portable"),
                            help="edgefuse's single-row mean policy: delegate (default), auto, float32-portable, portable")
    export_llm.add_argument("--hydra-dir", default=None, metavar="DIR",
                            help="hydra's run folder (its .hydra record and export_llm.log); default: the .pte's folder")
    export_llm.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                            help="export_llm's overrides of LlmConfig's settings, e.g. base.model_class=qwen3_0_6b "
                            "backend.xnnpack.enabled=True (hydra's own settings are refused)")

    from edgefuse.cli.hf_commands import add_export_hf_arguments

    export_hf = commands.add_parser(
        "export-hf", parents=[common],
        help="Hugging Face's export (optimum-executorch's main_export) with the edgefuse-xnnpack recipe",
        description="Export a Hugging Face model saved with save_pretrained through optimum-executorch's main_export "
        "(task text-generation) with edgefuse's recipe edgefuse-xnnpack (optimum's xnnpack recipe with edgefuse's "
        "XNNPACK lowering), and print the delegates, the means and casts left outside them and the kernels outside "
        "by op; --compare exports with optimum's own xnnpack recipe too and prints both side by side. Example: "
        "edgefuse export-hf qwen3-folder -o out --compare --use_custom_sdpa --qlinear 8da4w --qembedding 8w. "
        "See docs/hf.md.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_export_hf_arguments(export_hf)

    bench_llm = commands.add_parser(
        "bench-llm", parents=[common],
        help="prefill and decode latency of two export_llm programs (stock, edgefuse) in executorch.runtime",
        description="Load two .pte written by export_llm (KV cache: inputs tokens [1, n] and input_pos [1]) with "
        "ExecuTorch's LLM custom ops, and time a prefill of N tokens then K decode steps of each, alternating, "
        "in runs that load both afresh with the one loaded first alternating (the program "
        "loaded first runs slower, by up to 9 % at a real-size decode step); prints the thread count and the CPU's "
        "float16, bfloat16 and int8 features, the medians over every round, each run's ratios edgefuse / stock "
        "and their geometric mean, in which the loaded-first slowdown cancels.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench_llm.add_argument("stock", metavar="STOCK.pte", help="the program of stock export_llm")
    bench_llm.add_argument("edgefuse", metavar="EDGEFUSE.pte", help="the program of edgefuse export-llm")
    bench_llm.add_argument("--prefill", type=int, default=100, help="prompt tokens (default 100)")
    bench_llm.add_argument("--decode", type=int, default=16, help="decode steps after the prompt (default 16)")
    bench_llm.add_argument("--threads", type=int, default=1, help="XNNPACK threadpool size (default 1)")
    bench_llm.add_argument("--rounds", type=int, default=30, help="timed rounds of each program (default 30)")
    bench_llm.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    bench_llm.add_argument("--runs", type=int, default=2,
                           help="runs (an even number), each loading both programs afresh, stock first in runs "
                           "1, 3, ... and edgefuse in runs 2, 4, ... (default 2; not bench's --runs, which counts "
                           "rounds)")
    from edgefuse.compare.llm_programs import add_max_bytes_argument

    add_max_bytes_argument(bench_llm)

    qnn_llama = commands.add_parser(
        "qnn-llama", parents=[common],
        help="ExecuTorch's static-Llama QNN script (llama.py) with edgefuse's QNN passes, each method checked on the HTP emulator",
        description=QNN_LLAMA, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qnn_llama.add_argument("--method", action="append", metavar="NAME",
                           help="run only this method on the emulator (repeatable; default: every method)")
    qnn_llama.add_argument("script_args", nargs=argparse.REMAINDER, metavar="LLAMA_ARGS",
                           help="llama.py's own arguments (--decoder_model, --checkpoint, --params, ...)")

    fuzz = commands.add_parser(
        "fuzz", help="differential fuzzing of edgefuse's rewrites (edgefuse.fuzz)", add_help=False,
        description="Runs edgefuse.fuzz.main with the remaining arguments.",
    )
    fuzz.add_argument("fuzz_args", nargs=argparse.REMAINDER, help="arguments for edgefuse.fuzz")
    return parser


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    parser.add_argument(
        "--dtype", choices=("float32", "float16", "bfloat16"), default=None,
        help="convert the model to this dtype (built-in models default to float32; not for .pt2)",
    )
    parser.add_argument(
        "--trust-pickled-pt2", action="store_true",
        help="load a .pt2 even when loading it runs code it carries (pickled weights, constants or inputs, "
        "compiled libraries, Python guards, operators edgefuse does not run from a file): only for a file "
        "whose source you trust",
    )
    parser.add_argument(
        "--max-bytes", type=_byte_count, default=DEFAULT_MAX_BYTES, metavar="N",
        help="the most bytes a .pt2 may hold or make: the file, each tensor it declares or makes, and their "
        f"total (4096, 512K, 64M, 4G; default {DEFAULT_MAX_BYTES >> 30}G)",
    )
    parser.add_argument(
        "--max-seconds", type=_seconds, default=DEFAULT_MAX_SECONDS, metavar="S",
        help=f"the longest loading a .pt2 and running it once may take (default {DEFAULT_MAX_SECONDS:g})",
    )


def _byte_count(text: str) -> int:
    try:
        count = byte_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if count < 1:
        raise argparse.ArgumentTypeError("must be at least 1 byte")
    return count


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < seconds < 1e6:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return seconds


def _qnn_arguments(parser: argparse.ArgumentParser, when: str) -> None:
    parser.add_argument("--soc", default=None, metavar="SOC",
                        help=f"{when}the Qualcomm SoC to compile for (default {DEFAULT_SOC})")
    parser.add_argument(
        "--precision", choices=LOWER_PRECISIONS, default=None,
        help=f"{when}fp16 (default) runs float16 on the HTP; 16a8w, 16a16w, 8a8w and 16a4w quantize with QNN's "
        "quantizer, calibrated on the example inputs",
    )


def _fuzz_arguments(argv: list[str]) -> argparse.Namespace | None:
    """``edgefuse [-q] fuzz ARGS...``: every argument after ``fuzz`` is the fuzzer's, ``--help`` included."""
    rest = list(argv)
    quiet = False
    while rest and rest[0] in ("-q", "--quiet"):
        quiet, rest = True, rest[1:]
    if rest[:1] != ["fuzz"]:
        return None
    return argparse.Namespace(command="fuzz", quiet=quiet, fuzz_args=rest[1:])


def _qnn_llama_arguments(argv: list[str]) -> argparse.Namespace | None:
    """``edgefuse [-q] qnn-llama ARGS...``: ``--method`` is edgefuse's, every other argument the script's."""
    from edgefuse.cli.qnn_llama import split_arguments

    rest = list(argv)
    quiet = False
    while rest and rest[0] in ("-q", "--quiet"):
        quiet, rest = True, rest[1:]
    if rest[:1] != ["qnn-llama"] or any(a in ("-h", "--help") for a in rest[1:]):
        return None
    methods, script = split_arguments(rest[1:])
    return argparse.Namespace(command="qnn-llama", quiet=quiet, methods=methods, script_args=script)


#: The commands that time programs: MKL is pinned to one thread before torch loads
#: (:mod:`edgefuse.runtime.blas`).
TIMING_COMMANDS = ("bench", "bench-llm")


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit code."""
    from edgefuse.console.progress import Progress
    from edgefuse.runtime.blas import pin_blas_threads
    from edgefuse.runtime.quiet import quiet_libraries

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = _fuzz_arguments(argv) or _qnn_llama_arguments(argv) or parser.parse_args(argv)
    quiet_libraries()
    if args.command in TIMING_COMMANDS:
        pin_blas_threads()
    say = Progress(enabled=not args.quiet)
    command = " ".join(filter(None, (args.command, getattr(args, "qnn_command", None))))
    return run_command(f"edgefuse {command}", _run, command, args, say)


def _run(command: str, args: argparse.Namespace, say) -> int:
    """Say what ``command`` is about to do, load what it needs and run it; :func:`main` turns what it raises
    into an exit code."""
    from edgefuse.console.progress import FirstHeavyImport, asks_for_help

    module, function, notice = COMMANDS[command]
    if notice is None or asks_for_help(getattr(args, "fuzz_args", [])):
        return getattr(importlib.import_module(module), function)(args, say)
    with FirstHeavyImport(say, notice.format(**vars(args))):
        return getattr(importlib.import_module(module), function)(args, say)

