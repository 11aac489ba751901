"""The ``export-llm`` and ``bench-llm`` commands: ExecuTorch's LLM export with edgefuse, and its latency.

``export-llm`` runs ExecuTorch's own ``export_llm`` command line with edgefuse's XNNPACK lowering
(:mod:`edgefuse.llm`) and prints what the program holds: its delegates and the kernels it calls
outside them, by op; ``--compare`` exports stock first and prints both side by side.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections import Counter
from typing import Callable

from edgefuse.errors import OK, UsageError

Say = Callable[[str], None]


def _check_overrides(overrides: list[str]) -> None:
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        raise UsageError(
            f"unknown option {flags[0]}: export-llm takes --config FILE, --compare, --single-row and "
            "export_llm's hydra overrides (key=value)"
        )


def _stock_path(path: str) -> str:
    """Where ``--compare`` keeps stock's program: beside edgefuse's, ``model.pte`` -> ``model.stock.pte``."""
    root, ext = os.path.splitext(path)
    return f"{root}.stock{ext or '.pte'}"


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


def export_llm(args, say: Say) -> int:
    """``edgefuse export-llm [--config FILE] [--compare] [OVERRIDES...]``."""
    from edgefuse.llm.export import run_export_llm
    from edgefuse.llm.pte import read_pte
    from edgefuse.table import format_table

    _check_overrides(args.overrides)
    if args.config is not None and not os.path.isfile(args.config):
        raise UsageError(f"--config {args.config}: no such file")
    passed = ([] if args.config is None else ["--config", args.config]) + list(args.overrides)
    stock_dir = tempfile.mkdtemp(prefix="edgefuse-export-llm-") if args.compare else None
    try:
        stock = None
        if args.compare:
            say("export_llm with stock lowering")
            staged = os.path.join(stock_dir, "stock.pte")
            stock = _run(run_export_llm, [*passed, f"export.output_name={staged}"], "stock", args.single_row)
        say("export_llm with edgefuse's XNNPACK lowering")
        ours = _run(run_export_llm, passed, "edgefuse", args.single_row)
        if ours.path is None:
            raise UsageError("export_llm wrote no .pte (export.export_only?)")
        programs = []
        if stock is not None:
            kept = _stock_path(ours.path)
            shutil.move(stock.path, kept)
            programs.append((f"stock ({kept})", read_pte(kept)))
        programs.append((f"edgefuse ({ours.path})", read_pte(ours.path)))
    finally:
        if stock_dir is not None:
            shutil.rmtree(stock_dir, ignore_errors=True)
    if ours.edgefuse_lowered:
        substituted = sum(l.substituted for l in ours.swap.lowerings)
        restored = sum(l.restored for l in ours.swap.lowerings)
        partitioners = ", ".join(p for l in ours.swap.lowerings for p in l.partitioners)
        print(f"edgefuse lowering: {partitioners}; {substituted} means, casts and scalar adds substituted, "
              f"{restored} of them left outside a delegate and restored (single-row policy {ours.swap.single_row!r})")
    else:
        print("this config lowers nothing for XNNPACK: the program is export_llm's own (enable "
              "backend.xnnpack.enabled=True for edgefuse's lowering)")
    header, rows = contents_rows(programs)
    print(format_table(header, rows))
    print(f"wrote {ours.path}" + (f" and {_stock_path(ours.path)}" if stock is not None else ""))
    return OK


def _run(run, passed: list[str], lowering: str, single_row: str | None):
    """One export; the library's errors become the command's."""
    from edgefuse.llm.export import ConfigRejected, UnsupportedConfig

    try:
        return run(passed, lowering=lowering, single_row=single_row)
    except ConfigRejected as error:
        raise UsageError(f"export_llm rejected the config:\n{error}") from error
    except UnsupportedConfig as error:
        raise UsageError(str(error)) from error
    except SystemExit as error:
        raise UsageError(f"export_llm exited (code {error.code}) before writing a .pte: "
                         "with export.export_only=True there is nothing to lower") from error
