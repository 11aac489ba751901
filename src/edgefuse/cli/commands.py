"""The ``report``, ``lower``, ``bench`` and ``fuzz`` commands: each takes parsed arguments, returns an exit code.

``lower --backend qnn`` lowers MODEL through ExecuTorch's own QNN flow with edgefuse's recomposition and
with the stock one, runs both ``.pte`` on the x86 HTP emulator against their references
(:mod:`edgefuse.compare.qnn_flows`) and prints a line for each. Stock's line is information: a stock program
that fails its check (ExecuTorch's own Llama with QK norms, whose rebuilt norms QNN computes wrong in
float16) does not fail the command. edgefuse's does, and so does edgefuse failing to lower what stock
lowers, or a norm edgefuse rebuilt that QNN did not compile as one RmsNorm. A model QNN lowers neither
way is bad input (exit 2, with QNN's reason). ``report --compile`` adds the QNN op each norm became.

They glue the parts together (MODEL resolution, the report, the two lowerings, the runtime, the map)
and print results to stdout; progress goes to the ``say`` callable (stderr). Errors are raised as
:mod:`edgefuse.inputs.errors` exceptions, which ``edgefuse.cli`` turns into messages and exit codes. Each
command checks its arguments and resolves MODEL before it imports ExecuTorch, so bad input is reported
without waiting for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Callable

from edgefuse.inputs.errors import CHECK_FAILED, OK, Unavailable, UsageError
from edgefuse.runtime.files import replace_atomically, why_unwritable
from edgefuse.runtime.threads import threads_problem

Say = Callable[[str], None]


def _spec(args):
    from edgefuse.inputs.modelspec import dtype_named, resolve
    from edgefuse.inputs.pt2_bounds import Limits

    return resolve(args.model, dtype_named(args.dtype), trust_pt2=getattr(args, "trust_pickled_pt2", False),
                   limits=Limits(args.max_bytes, args.max_seconds))


def _check_backend(name: str) -> None:
    from edgefuse.core.profiles import PROFILES

    if name not in PROFILES:
        raise UsageError(f"unknown backend {name!r}; edgefuse knows {', '.join(sorted(PROFILES))}")


def default_map_path(beside: str) -> str:
    """``out.pte`` -> ``out.delegates.svg``: the map goes next to the file it describes."""
    root, _ = os.path.splitext(beside)
    return root + ".delegates.svg"


def _check_output(path: str, what: str) -> None:
    """Fail before the slow work, not after it, when ``path`` cannot be written."""
    reason = why_unwritable(path)
    if reason is not None:
        raise UsageError(f"cannot write the {what} to {path}: {reason}")


def _check_distinct(model: str, outputs: dict[str, str]) -> None:
    """Refuse two outputs written to one file, or an output written over the model file it reads."""
    from edgefuse.inputs.modelspec import model_file

    seen: dict[object, str] = {}
    source = model_file(model)
    if source is not None and os.path.exists(source):
        seen[_identity(source)] = f"MODEL {model}"
    for what, path in outputs.items():
        key = _identity(path)
        if key in seen:
            raise UsageError(f"the {what} would be written to {path}, which is also the {seen[key]}")
        seen[key] = what


def _identity(path: str) -> object:
    """What names one file: its device and inode when it exists (a hard link too), else its real path."""
    try:
        status = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    return (status.st_dev, status.st_ino)


def _write(path: str, what: str, write: Callable[[], None]) -> None:
    """Run ``write``; a file system error (the path changed since it was checked) is the user's to fix."""
    try:
        write()
    except OSError as error:
        raise UsageError(f"cannot write the {what} to {path}: {error.strerror or error}") from error


def _write_map(path: str, summaries, title: str, say: Say, named: bool = True) -> None:
    """Write the map to ``path``: as any output when the user ``named`` it, else (its default name) only as
    a new file (:func:`edgefuse.runtime.files.write_new`), never through a link or over another file."""
    from edgefuse.compare.delegate_map import render, write
    from edgefuse.runtime.files import write_new

    def write_map() -> None:
        if named:
            write(path, summaries, title)
            return
        try:
            write_new(path, render(summaries, title))
        except FileExistsError as error:
            raise UsageError(_taken(path)) from error

    _write(path, "delegate map", write_map)
    say(f"wrote the delegate map to {path}")


def _taken(map_path: str) -> str:
    """Why the map's default name cannot be written, and what to do."""
    what = "a symlink" if os.path.islink(map_path) else "a file"
    return (f"the delegate map's default name {map_path} exists ({what}) and this run did not write it; edgefuse "
            "writes a name it chose only as a new file: remove it, or name the map with --map PATH")


def stock_pte_path(beside: str) -> str:
    """``out.pte`` -> ``out.stock.pte``: where ``--explorer`` keeps stock's program beside edgefuse's."""
    root, _ = os.path.splitext(beside)
    return root + ".stock.pte"


def _explorer_paths(output: str) -> dict[str, str]:
    """The files ``--explorer`` writes beside the edgefuse ``output`` .pte, by what each is: stock's program
    and the two overlays. Each is a name edgefuse chose, written only as a new file: checked before the
    slow work."""
    from edgefuse.compare.explorer import overlay_path

    stock = stock_pte_path(output)
    paths = {"stock .pte": stock, "Model Explorer overlay": overlay_path(output),
             "stock's Model Explorer overlay": overlay_path(stock)}
    for what, path in paths.items():
        _check_output(path, what)
        if os.path.lexists(path):
            raise UsageError(f"the {what}'s name {path} exists and this run did not write it; edgefuse writes a "
                             "name it chose only as a new file: remove it, or name the .pte otherwise")
    return paths


def _write_explorer(output: str, programs, norms: dict[str, str], tell: Callable[[str], None] = print) -> None:
    """Write stock's program beside edgefuse's at ``output`` and each one's Model Explorer overlay, and
    ``tell`` how to open them. ``programs`` are the stock and edgefuse :class:`CheckedProgram`, lowered with
    ``modules``; ``norms`` maps each norm's module path to what edgefuse decided for it."""
    from edgefuse.compare.explorer import left_by, open_command, overlay_path, write_overlay
    from edgefuse.runtime.files import write_new

    stock, ours = programs
    stock_path = stock_pte_path(output)
    _write(stock_path, "stock .pte", lambda: write_new(stock_path, stock.pte))
    tell(f"wrote {stock_path} ({len(stock.pte)} bytes, stock lowering)")
    for path, lowered in ((output, ours), (stock_path, stock)):
        overlay = overlay_path(path)
        _write(overlay, "Model Explorer overlay",
               lambda: write_overlay(path, lowered.pte, lowered.modules, left_by(lowered.how, norms)))
        tell(f"Model Explorer overlay of the {lowered.how} program: {overlay}; open it with")
        tell(f"  {open_command(path)}")


def _stage(args) -> str:
    """The report's stage: as given, else capture with ``--quantize`` (quantizers read the captured graph)
    and edge without."""
    quantize = getattr(args, "quantize", None)
    stage = args.stage or ("capture" if quantize else "edge")
    if quantize and stage != "capture":
        raise UsageError(f"--quantize {quantize} quantizes the captured graph: use --stage capture, or leave --stage out")
    if quantize and args.backend != "qnn":
        raise UsageError(f"--quantize {quantize} rebuilds the norms for the qnn backend: leave --backend out")
    return stage


def _quantization(spec, say: Say) -> dict:
    """How each norm of ``spec`` is quantized for QNN, keyed like the report's rows."""
    from edgefuse.runtime.quiet import quiet_root_logger
    from edgefuse.qnn.quantizer import QnnUnavailable, quantization_by_norm

    say("quantizing the captured graph for QNN (prepare_pt2e, calibration on the example inputs, convert_pt2e)")
    model = spec.module if spec.module is not None else spec.export().module()
    try:
        with quiet_root_logger():
            return quantization_by_norm(model, spec.inputs)
    except QnnUnavailable as error:
        raise Unavailable(f"--quantize qnn needs ExecuTorch's Qualcomm quantizer: {error}") from error
    except Exception as error:  # noqa: BLE001  (the released quantizer's own failure on this model)
        raise UsageError(
            f"the released QnnQuantizer could not quantize {spec.name}: {type(error).__name__}: {error}"
        ) from error


def report_command(args, say: Say) -> int:
    """``edgefuse report MODEL``: the per-norm table (or JSON) and its summary line."""
    _check_backend(args.backend)
    stage = _stage(args)
    if args.compile and args.backend != "qnn":
        raise UsageError("--compile lowers with QNN's compiler: use --backend qnn (the default)")
    compile_for = qnn_options(args, "--compile", args.compile)
    if compile_for is not None:
        from edgefuse.compare.qnn_flows import require_libraries

        require_libraries()  # missing: exit 3 before the slow work
    outputs = {}
    if args.map:
        _check_output(args.map, "delegate map")
        outputs["delegate map"] = args.map
    if args.explorer:
        _check_pte_name(args.explorer, "--explorer")
        _check_output(args.explorer, ".pte")
        outputs.update({".pte": args.explorer, **_explorer_paths(args.explorer)})
    _check_distinct(args.model, outputs)
    spec = _spec(args)
    from edgefuse.compare.report import add_quantization, build_report, format_report, to_json  # ExecuTorch: once the input is good

    # the map lowers the same export the report reads: neither changes the program it is given
    program = None
    if args.map or args.explorer:
        say(f"exporting {spec.name}")
        program = spec.export()
    from edgefuse.console.command import native_stdout_to_stderr

    # with --json, stdout holds the JSON alone: what a native library writes there goes to stderr
    with native_stdout_to_stderr() if args.json else contextlib.nullcontext():
        result = build_report(spec, backend=args.backend, stage=stage, progress=say, program=program)
        if getattr(args, "quantize", None):
            add_quantization(result, args.quantize, _quantization(spec, say))
        if compile_for is not None:
            _add_compiled(result, spec, *compile_for, say=say)
    if args.json:
        print(json.dumps(to_json(result), indent=2))
    else:
        print(format_report(result))
    lowered = None
    if args.explorer:
        from edgefuse.compare.explorer import report_norms
        from edgefuse.compare.pte_checks import lower_to_pte

        lowered = [lower_to_pte(program, how, say, modules=True) for how in ("stock", "edgefuse")]
        _write(args.explorer, ".pte", lambda: replace_atomically(args.explorer, lambda f: f.write(lowered[1].pte)))
        # with --json, stdout holds the JSON alone: the files go to stderr
        tell = (lambda line: print(line, file=sys.stderr)) if args.json else print
        tell(f"wrote {args.explorer} ({len(lowered[1].pte)} bytes, edgefuse lowering)")
        _write_explorer(args.explorer, lowered, report_norms(result.rows, args.backend), tell)
    if args.map:
        from edgefuse.compare.pte_checks import lower_to_pte

        summaries = [p.summary for p in lowered] if lowered else [
            lower_to_pte(program, how, say, serialize=False).summary for how in ("stock", "edgefuse")]
        _write_map(args.map, summaries, f"delegate map: {spec.name} ({_dtype(spec)})", say)
    return OK if result.ok else CHECK_FAILED


def qnn_options(args, flag: str, wanted: bool) -> tuple[str, str] | None:
    """``(soc, precision)`` for a QNN lowering when ``wanted`` (``flag`` names the option that asks for it),
    else None; ``--soc`` or ``--precision`` without it, a SoC ExecuTorch does not know, a precision QNN does
    not compile for that SoC, or ``--dtype bfloat16`` (QNN has no bfloat16) is a usage error."""
    from edgefuse.cli import DEFAULT_SOC

    soc, precision = getattr(args, "soc", None), getattr(args, "precision", None)
    if not wanted:
        given = [name for name, value in (("--soc", soc), ("--precision", precision)) if value is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} {'are' if len(given) > 1 else 'is'} for QNN: add {flag}")
        return None
    if getattr(args, "dtype", None) == "bfloat16":
        raise UsageError(f"--dtype bfloat16 with {flag}: QNN's HTP computes no bfloat16; use --dtype float32 or "
                         "float16 (with --precision fp16 the HTP runs float16)")
    from edgefuse.qnn.socs import soc_problem

    soc, precision = soc or DEFAULT_SOC, precision or "fp16"
    problem = soc_problem(soc, precision)
    if problem is not None:
        raise UsageError(problem)
    return soc, precision


def _output_paths(args) -> tuple[str, str]:
    """``-o`` and the map path, checked before any slow work."""
    output = args.output
    _check_pte_name(output, "-o")
    map_path = args.map or default_map_path(output)
    _check_output(output, ".pte")
    _check_output(map_path, "delegate map")
    if args.map is None and os.path.lexists(map_path):
        raise UsageError(_taken(map_path))
    explorer = _explorer_paths(output) if args.explorer else {}
    _check_distinct(args.model, {".pte": output, "delegate map": map_path, **explorer})
    return output, map_path


def _check_pte_name(output: str, flag: str) -> None:
    """Refuse an output name that is no ``.pte`` program's."""
    if not output.endswith(".pte"):
        raise UsageError(f"{flag} {output}: the output is an ExecuTorch program and its name must end in .pte")
    if os.path.basename(output) == ".pte":
        raise UsageError(f"{flag} {output}: name the program before its .pte (model.pte), not a hidden file '.pte'")


def lower_command(args, say: Say) -> int:
    """``edgefuse lower MODEL -o out.pte``: edgefuse's XNNPACK (or QNN) flow, compared with stock, and the map."""
    qnn = qnn_options(args, "--backend qnn", args.backend == "qnn")
    if qnn is not None and args.explorer:
        raise UsageError("--explorer marks XNNPACK programs (Model Explorer opens no QNN delegate): leave out "
                         "--backend qnn")
    output, map_path = _output_paths(args)
    if qnn is not None:
        return _lower_qnn(args, *qnn, output=output, map_path=map_path, say=say)
    spec = _spec(args)
    from edgefuse.compare.pte_checks import comparison_lines, flat_tensors, lower_to_pte, run_and_check

    say(f"exporting {spec.name}")
    program = spec.export()
    expected = flat_tensors(spec.eager())
    reference = _reference(spec)
    stock = run_and_check(lower_to_pte(program, "stock", say, modules=args.explorer), spec.inputs, expected,
                          reference=reference)
    try:
        ours = lower_to_pte(program, "edgefuse", say, modules=args.explorer)
    except Unavailable as error:
        print(f"{spec.name} ({_dtype(spec)}), XNNPACK:")
        print("\n".join(comparison_lines(stock, None)))
        error.args = (f"{error.args[0]}; no .pte was written",)
        raise
    run_and_check(ours, spec.inputs, expected, stock, reference=reference)
    _write(output, ".pte", lambda: replace_atomically(output, lambda f: f.write(ours.pte)))
    print(f"{spec.name} ({_dtype(spec)}), XNNPACK, before (stock) and after (edgefuse):")
    print("\n".join(comparison_lines(stock, ours)))
    print(f"wrote {output} ({len(ours.pte)} bytes, edgefuse lowering)")
    _write_map(map_path, [stock.summary, ours.summary], f"delegate map: {spec.name} ({_dtype(spec)})", say,
               named=args.map is not None)
    print(f"delegate map: {map_path}")
    if args.explorer:
        from edgefuse.compare.explorer import placement_norms

        _write_explorer(output, [stock, ours], placement_norms(program, ours.manager))
    return _checked([stock, ours])


def _lower_qnn(args, soc: str, precision: str, *, output: str, map_path: str, say: Say) -> int:
    """``edgefuse lower MODEL --backend qnn -o out.pte``; returns the exit code."""
    from edgefuse.compare import qnn_flows
    from edgefuse.compare.qnn_flows import EDGEFUSE, STOCK

    qnn_flows.require_libraries()  # missing: exit 3 before the slow work
    spec = _spec(args)
    module = _module(spec)
    reference = _reference(spec)
    ours = qnn_flows.lower_qnn(module, spec.inputs, EDGEFUSE, soc=soc, precision=precision, say=say)
    stock = qnn_flows.lower_qnn(module, spec.inputs, STOCK, soc=soc, precision=precision, say=say)
    title = f"{spec.name} ({_dtype(spec)}), QNN HTP {soc} {precision}, edgefuse and stock:"
    if not ours.lowered_ok:
        if not stock.lowered_ok:
            raise UsageError(f"{spec.name}: {ours.failure}; no .pte was written")
        print(title)
        print(f"  {ours.line()}")
        print(f"  {qnn_flows.run_and_check(stock, module, spec.inputs, say, reference).line()}")
        print("check failed: edgefuse's QNN lowering failed where stock's lowered; no .pte was written")
        return CHECK_FAILED
    qnn_flows.run_and_check(ours, module, spec.inputs, say, reference)
    qnn_flows.run_and_check(stock, module, spec.inputs, say, reference)
    qnn_flows.check_repeatable([ours, stock], spec.inputs)
    _write(output, ".pte", lambda: replace_atomically(output, lambda f: f.write(ours.pte)))
    print(title)
    print(f"  {ours.line()}")
    print(f"  {stock.line()}")
    print(f"wrote {output} ({len(ours.pte)} bytes, edgefuse lowering)")
    summaries = [p.summary for p in (stock, ours) if p.summary is not None]
    _write_map(map_path, summaries, f"delegate map: {spec.name} ({_dtype(spec)}), QNN {soc} {precision}", say,
               named=args.map is not None)
    print(f"delegate map: {map_path}")
    failures = qnn_flows.failures(ours)
    if failures:
        print(f"check failed: {'; '.join(failures)}")
        return CHECK_FAILED
    return OK


def _add_compiled(result, spec, soc: str, precision: str, say: Say) -> None:
    """Lower ``spec`` with edgefuse's QNN flow and record on each report row the QNN op its norm became."""
    from edgefuse.compare import qnn_flows
    from edgefuse.compare.qnn_flows import EDGEFUSE

    program = qnn_flows.lower_qnn(_module(spec), spec.inputs, EDGEFUSE, soc=soc, precision=precision, say=say)
    if not program.lowered_ok:
        raise UsageError(f"{spec.name}: {program.failure}")
    result.compiled = f"QNN {soc} {precision}"
    result.rms_norms = program.rms_norms
    norms, roundings = qnn_flows.norm_ops(program.lowered), qnn_flows.norm_roundings(program.lowered)
    for row in result.rows:
        described = qnn_flows.describe_norm(norms.get(row.decision.module_path or qnn_flows.ROOT, []))
        row.compiled = qnn_flows.describe_rounding(program.lowered, row.decision.module_path, described, roundings)


def _module(spec):
    """The module QNN's flow exports: the eager module, or a saved program's module."""
    return spec.module if spec.module is not None else spec.program.module()


def bench_command(args, say: Say) -> int:
    """``edgefuse bench MODEL``: stock against edgefuse in the runtime, alternating, with ratios."""
    if args.runs < 10:
        raise UsageError("--runs must be at least 10")
    problem = threads_problem(args.threads)
    if problem:
        raise UsageError(problem)
    if args.warmup is not None and args.warmup < 0:
        raise UsageError("--warmup must be 0 or more")
    spec = _spec(args)
    from edgefuse.compare.pte_checks import flat_tensors, lower_to_pte, run_and_check
    from edgefuse.console.tables import format_table
    from edgefuse.runtime import flat_inputs, set_threads
    from edgefuse.runtime.timer import Task, alternate, conditions

    say(f"exporting {spec.name}")
    program = spec.export()
    expected = flat_tensors(spec.eager())
    stock = lower_to_pte(program, "stock", say)
    ours = lower_to_pte(program, "edgefuse", say)
    threads = set_threads(args.threads)
    reference = _reference(spec)
    run_and_check(stock, spec.inputs, expected, reference=reference)
    run_and_check(ours, spec.inputs, expected, stock, reference=reference)
    warmup = args.warmup if args.warmup is not None else max(1, args.runs // 10)
    say(f"timing {args.runs} runs of each program, alternating, after {warmup} warm-up rounds")
    flat = flat_inputs(spec.inputs)
    tasks = [Task(lowered.how, lambda mark, loaded=lowered.loaded: loaded.execute(flat)) for lowered in (stock, ours)]
    stock_time, our_time = (samples.median() for samples in alternate(tasks, args.runs, warmup))
    rows = []
    for lowered, median in ((stock, stock_time), (ours, our_time)):
        rows.append([
            lowered.how, lowered.summary.delegates, len(lowered.summary.outside), f"{lowered.error:.2e}",
            "yes" if lowered.ok else "NO", f"{median:.1f}", f"{median / stock_time:.2f}",
        ])
    print(f"{spec.name} ({_dtype(spec)}) in executorch.runtime, {args.runs} runs each alternating after {warmup} "
          "warm-up rounds; median wall-clock microseconds of a full call; ratio is the median against stock's "
          "(below 1 is faster)")
    print(f"{conditions(threads)}")
    print(format_table(("program", "delegates", "outside", f"err vs {reference}", "ok", "median us", "ratio"), rows))
    return _checked([stock, ours])


def _reference(spec) -> str:
    """What a model's outputs are checked against: eager, or for a saved program (no eager module) that program."""
    return "eager" if spec.module is not None else "program"


def _checked(programs) -> int:
    """OK when every lowered program passed its check against its reference; else say which failed."""
    from edgefuse.compare.pte_checks import failed_checks_line

    line = failed_checks_line(programs)
    if line is None:
        return OK
    print(line)
    return CHECK_FAILED


def fuzz_command(args, say: Say) -> int:
    """``edgefuse fuzz ...``: hands its arguments to ``edgefuse.fuzz.main``, which another part provides."""
    try:
        from edgefuse.fuzz import main
    except ImportError as error:
        raise Unavailable(
            f"edgefuse fuzz is unavailable in this installation: the module edgefuse.fuzz could not be "
            f"imported ({type(error).__name__}: {error})"
        ) from error
    fuzz_args = list(args.fuzz_args)
    if args.quiet and not {"-q", "--quiet"} & set(fuzz_args):
        fuzz_args.insert(0, "--quiet")  # edgefuse -q fuzz: the fuzzer's progress goes quiet too
    code = main(fuzz_args)
    return int(code or 0)


def _dtype(spec) -> str:
    from edgefuse.core._fx import dtype_name

    return dtype_name(spec.dtype) if spec.dtype is not None else "no float weights"
