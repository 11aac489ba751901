"""The ``export-llm`` and ``bench-llm`` commands: ExecuTorch's LLM export with edgefuse, and its latency.

``export-llm`` runs ExecuTorch's own ``export_llm`` command line with edgefuse's XNNPACK lowering
(:mod:`edgefuse.llm`) and prints what the program holds: its delegates and the kernels it calls
outside them, by op; ``--compare`` exports stock first and prints both side by side.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections import Counter
from typing import Callable

from edgefuse.inputs.errors import OK, UsageError

Say = Callable[[str], None]


def _check_overrides(overrides: list[str]) -> None:
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        raise UsageError(
            f"unknown option {flags[0]}: export-llm takes --config FILE, --compare, --single-row, --hydra-dir "
            "and export_llm's overrides (key=value)"
        )


def _stock_path(path: str) -> str:
    """Where ``--compare`` keeps stock's program: beside edgefuse's, ``model.pte`` -> ``model.stock.pte``."""
    root, ext = os.path.splitext(path)
    return f"{root}.stock{ext or '.pte'}"


def _keep(staged: str, kept: str) -> None:
    """Copy stock's program from the private folder it was exported in to ``kept``, a name edgefuse chose
    beside the user's output: only as a new file (:func:`edgefuse.runtime.files.write_new`), never through
    a link or over a file this run did not write."""
    from edgefuse.runtime.files import write_new

    try:
        with open(staged, "rb") as source:
            write_new(kept, source)
    except FileExistsError as error:
        raise UsageError(f"stock's program is kept beside edgefuse's, but {error.strerror}: remove it, or choose "
                         "another export.output_name") from error
    except OSError as error:
        raise UsageError(f"cannot write stock's program to {kept}: {error.strerror or error}") from error


def contents_rows(programs: list[tuple[str, object]]) -> tuple[list[str], list[list[object]]]:
    """Header and rows of the side-by-side table: delegates, kernels outside, then each kernel by op."""
    header = ["", *(label for label, _ in programs)]
    rows: list[list[object]] = []
    backends = sorted({b for _, c in programs for b in c.delegates})
    for backend in backends or ["(none)"]:
        rows.append([f"delegates ({backend})", *(c.delegates.get(backend, 0) for _, c in programs)])
    rows.append(["kernels outside", *(c.kernel_count for _, c in programs)])
    total: Counter = Counter()
    for _, c in programs:
        total.update(c.kernels)
    for op, _ in sorted(total.items(), key=lambda item: (-item[1], item[0])):
        rows.append([f"  {op}", *(c.kernels.get(op, 0) for _, c in programs)])
    return header, rows


def export_llm_command(args, say: Say) -> int:
    """``edgefuse export-llm [--config FILE] [--compare] [--hydra-dir DIR] [OVERRIDES...]``."""
    from edgefuse.console.tables import format_table
    from edgefuse.llm.pte import read_pte

    _check_overrides(args.overrides)
    passed = ([] if args.config is None else ["--config", args.config]) + list(args.overrides)
    stock_dir = tempfile.mkdtemp(prefix="edgefuse-export-llm-") if args.compare else None
    try:
        stock, stock_failure = None, None
        if args.compare:
            say("export_llm with stock lowering")
            staged = os.path.join(stock_dir, "stock.pte")
            try:
                stock = _run([*passed, f"export.output_name={staged}"], "stock", args.single_row)
            except StockQnnFailed as error:
                stock_failure = str(error)
        say("export_llm with edgefuse's lowering")
        ours = _run(passed, "edgefuse", args.single_row, args.hydra_dir)
        if ours.path is None:
            raise UsageError("export_llm wrote no .pte (export.export_only?)")
        programs, exports = [], []
        if stock is not None:
            kept = _stock_path(ours.path)
            _keep(stock.path, kept)
            programs.append((f"stock ({kept})", read_pte(kept)))
            exports.append(stock)
        programs.append((f"edgefuse ({ours.path})", read_pte(ours.path)))
        exports.append(ours)
    finally:
        if stock_dir is not None:
            shutil.rmtree(stock_dir, ignore_errors=True)
    header, rows = contents_rows(programs)
    if ours.swap.qnn is not None:
        print(qnn_summary_line(ours))
        if stock_failure is not None:
            print(f"stock: {stock_failure}")
        kernels = next(i for i, row in enumerate(rows) if row[0] == "kernels outside")
        rows.insert(kernels, ["QNN RmsNorm ops (compiled)", *(e.swap.qnn.rms_norms for e in exports)])
    elif ours.edgefuse_lowered:
        substituted = sum(l.substituted for l in ours.swap.lowerings)
        restored = sum(l.restored for l in ours.swap.lowerings)
        partitioners = ", ".join(p for l in ours.swap.lowerings for p in l.partitioners)
        print(f"edgefuse lowering: {partitioners}; {substituted} means, casts, scalar adds and tanh GELUs substituted, "
              f"{restored} of them left outside a delegate and restored (single-row policy {ours.swap.single_row!r})")
    else:
        print("this config lowers nothing for XNNPACK or QNN: the program is export_llm's own (enable "
              "backend.xnnpack.enabled=True or backend.qnn.enabled=True for edgefuse's lowering)")
    print(format_table(header, rows))
    print(f"wrote {ours.path}" + (f" and {_stock_path(ours.path)}" if stock is not None else ""))
    return OK


def qnn_summary_line(export) -> str:
    """One line on edgefuse's QNN passes in an export: the norms rebuilt (and why others were left), the
    nodes the cast removal removed, and the ``RmsNorm`` ops QNN compiled."""
    record = export.swap.qnn
    runs = record.patch.runs if record.patch is not None else []
    decisions = record.decisions
    left = Counter(d.reason for d in decisions if not d.rebuilt)
    why = "; left: " + ", ".join(f"{n} ({reason})" for reason, n in left.items()) if left else ""
    pipelines = ", ".join(sorted({r.pipeline for r in runs})) or "no"
    graphs = len(record.graphs.delegates) if record.graphs is not None else 0
    return (f"edgefuse QNN passes ({pipelines} pipeline runs): {sum(d.rebuilt for d in decisions)} of "
            f"{len(decisions)} norm decisions rebuilt{why}; {sum(len(r.removed) for r in runs)} redundant nodes "
            f"removed; QNN compiled {record.rms_norms} RmsNorm ops in {graphs} graph(s)")


class StockQnnFailed(Exception):
    """Stock's QNN lowering failed under ``--compare``: edgefuse's still runs, and the failure is printed."""


def _run(passed: list[str], lowering: str, single_row: str | None, hydra_dir: str | None = None):
    """One run of export_llm's command line with ``lowering`` (hydra's run folder ``hydra_dir``, else the
    ``.pte``'s), its own output (hydra's and the model's lines, QNN's per-op lines) on stderr and its log
    records below ERROR dropped; the library's errors become the command's (a failure after edgefuse's
    lowering started is not caught: it is a bug, exit 4)."""
    from edgefuse.runtime.quiet import quiet_root_logger
    from edgefuse.llm.config_check import ConfigRefused
    from edgefuse.llm.export import ConfigRejected, QnnExportFailed, run_export_llm
    from edgefuse.inputs.errors import qnn_sdk_error
    from edgefuse.qnn.sdk import QnnSdkUnavailable

    try:
        with quiet_root_logger(), contextlib.redirect_stdout(sys.stderr):  # stdout holds the result alone
            return run_export_llm(passed, lowering=lowering, single_row=single_row, hydra_dir=hydra_dir)
    except ConfigRefused as error:
        raise UsageError(f"refused: {error}") from error
    except ConfigRejected as error:
        raise UsageError(f"export_llm rejected the config:\n{error}") from error
    except QnnExportFailed as error:
        if lowering == "stock":
            raise StockQnnFailed(str(error)) from error
        raise UsageError(str(error)) from error
    except QnnSdkUnavailable as error:
        raise qnn_sdk_error(error, "the config lowers for QNN: ") from error
    except SystemExit as error:
        raise UsageError(f"export_llm exited (code {error.code}) before writing a .pte: "
                         "with export.export_only=True there is nothing to lower") from error


def bench_llm_command(args, say: Say) -> int:
    """``edgefuse bench-llm STOCK.pte EDGEFUSE.pte``: prefill latency and decode ms per token, alternating, in
    ``--runs`` runs on programs loaded afresh, the one loaded first alternating."""
    from edgefuse.compare.llm_programs import check_bench_numbers

    check_bench_numbers(args, (("--runs", args.runs, 2), ("--max-bytes", args.max_bytes, 1)))
    if args.runs % 2:
        raise UsageError(f"--runs {args.runs}: give an even number, so that each program is loaded first in half "
                         "the runs (the one loaded first runs slower; the geometric mean of the runs' ratios "
                         "cancels that over such pairs)")
    paths = (args.stock, args.edgefuse)
    from edgefuse.compare.llm_programs import (
        failed_steps_named,
        load_llm_programs,
        read_llm_program,
        refuse_changed,
        try_llm_programs,
    )
    from edgefuse.llm.latency import pooled, time_runs
    from edgefuse.runtime import set_threads
    from edgefuse.runtime.timer import conditions

    threads = set_threads(args.threads)
    labels = ("stock", "edgefuse")
    programs = [(path, read_llm_program(path, args.max_bytes)) for path in paths]
    say("trying both programs in a child process: loaded, a prefill and the decode steps")
    try_llm_programs(programs, args.prefill, args.decode)

    def load(order):
        say(f"run with {labels[order[0]]} loaded first: {args.rounds} rounds of each program, alternating, after "
            f"{args.warmup} warm-up rounds")
        return load_llm_programs([programs[k] for k in order], say)

    with failed_steps_named(paths):
        runs = time_runs(load, len(paths), args.prefill, args.decode, args.runs, args.rounds, args.warmup)
    refuse_changed(programs)  # a write during the last run's rounds reached what it ran
    timing = pooled(runs)
    medians = [timing.medians(k) for k in range(len(paths))]
    from edgefuse.console.tables import format_table

    rows = []
    for k, (label, path, (p, d)) in enumerate(zip(labels, paths, medians)):
        prefill, decode = timing.ratios(k, 0)
        rows.append([label, path, f"{p:.3f}", f"{d:.4f}", f"{prefill:.3f}", f"{decode:.3f}"])
    print(f"executorch.runtime with the LLM custom ops, {conditions(threads)}; prefill of {args.prefill} tokens at "
          f"position 0, then {args.decode} decode steps of one token; {args.runs} runs of {args.rounds} rounds "
          f"alternating after {args.warmup} warm-up rounds, both programs loaded "
          "afresh each run, stock first in runs 1, 3, ... and edgefuse in runs 2, 4, ...; medians over every "
          "round of every run; ratio = edgefuse / stock (below 1 is faster), each run's ratio of medians and "
          "their geometric mean over the runs, in which the loaded-first slowdown cancels")
    print(format_table(("program", "file", "prefill ms", "decode ms/token", "prefill ratio", "decode ratio"), rows))
    for k, run in enumerate(runs, 1):
        prefill, decode = run.timing.ratios()
        print(f"run {k}, {labels[run.order[0]]} loaded first: prefill ratio {prefill:.3f}, decode ratio {decode:.3f}")
    difference = float((timing.last_logits[0].float() - timing.last_logits[1].float()).abs().max())
    print(f"last decode step's logits, largest difference between the programs: {difference:.3g}")
    return OK
