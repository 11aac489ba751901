"""LLM latency, stock against edgefuse: ExecuTorch's Llama exported both ways, prefill and decode timed.

``python -m edgefuse.tools.llm_latency [--sizes 128x2,1024x4] [--dtypes fp32,fp16,bf16,8da4w] [--prefill 100]
[--decode 32] [--threads 1] [--rounds 30] [--warmup 3] [--repeats 1] [--dir DIR] [--export-only |
--bench-only DIR] [--profile SIZE:DTYPE] [--max-bytes N]``

For each size (``DIMxLAYERS``: width, heads of 16, half as many KV heads, hidden width twice the width,
vocabulary 256) it writes params and a random-weight checkpoint of ExecuTorch's Llama, and for each dtype
exports it with ``export_llm`` stock and with edgefuse's lowering from the same overrides (KV cache,
custom SDPA, XNNPACK with extended ops; ``fp16``: ``model.dtype_override=fp16``; ``bf16``: with
``backend.xnnpack.enable_bf16=True``; ``8da4w``: group size 32). Each pair is checked once: both load,
their logits have the dtype asked for, and both programs pass ``llm_check``'s check against the eager
model (a float program within the dtype's bound of eager and of stock's logits; an 8da4w program within
stock's error, edgefuse's plus that bound and the rounding floor, since the int8 rounding of its
activations turns a last-bit difference into a whole step: the table shows edgefuse's error and what it
is allowed). Then each
pair is timed as ``edgefuse bench-llm`` times it (a prefill of ``--prefill`` tokens at position 0 and
``--decode`` single tokens, the two programs alternating round by round, medians over ``--rounds``) in
two runs, each on both programs loaded afresh, stock loaded first in one and edgefuse in the other (the
program loaded first runs slower, by more than the differences looked for at real size:
:mod:`edgefuse.llm.latency`); a pair whose prefill or decode ratio (edgefuse / stock) over both runs is
0.99 or above gets ``--repeats`` more such pairs of runs. One table on stdout: size, dtype, run, the
program loaded first, stock and edgefuse prefill ms and their ratio, stock and edgefuse decode ms per
token and their ratio, a line per run and an ``all`` line per pair with the medians over every round of
its runs and the geometric mean of its runs' ratios, which the verdict reads; progress on stderr.

``--export-only --dir DIR`` prepares the programs (``DIR/manifest.json`` names them), which
``--bench-only DIR`` times later, on an idle machine. ``--profile SIZE:DTYPE`` prints, instead of the
timing, where each program of that pair spends its time (ETDump of the released runtime: each XNNPACK
operator inside the delegates, each kernel outside, by op). Each program is checked and tried in a child
process first, as ``bench-llm`` does (``--max-bytes``). A benchmark, not a test: it asserts nothing
about times. Exit status: 0 done, 1 a pair's check failed, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if __name__ == "__main__":
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()

from edgefuse.console.command import run_command
from edgefuse.inputs.errors import CHECK_FAILED, OK, UsageError

if TYPE_CHECKING:
    from edgefuse.compare.llm_programs import CheckedPte
    from edgefuse.llm.latency import Inputs

#: The precisions and the export_llm overrides that set each (beside llm_check's cases).
DTYPES = ("fp32", "fp16", "bf16", "8da4w")
SIZES = ("128x2", "1024x4")
#: The logits' dtype each precision's program must return.
LOGITS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "8da4w": "float32"}
MANIFEST = "manifest.json"
#: The most a manifest may hold: a pair takes about a kilobyte.
MANIFEST_BYTES = 1 << 20
#: A ratio at or above this is timed again (within 1% of 1.00, or slower).
REPEAT_AT = 0.99


def dtype_case(size: str, dtype: str):
    """llm_check's Llama case of ``dtype`` at ``size`` (``DIMxLAYERS``)."""
    from edgefuse.tools.llm_check import BF16, CASES, FP16, Case, sized

    overrides = {"fp32": (), "fp16": FP16, "bf16": BF16, "8da4w": CASES["llama-8da4w"].overrides}[dtype]
    dim, layers = parse_size(size)
    case = Case(f"llama-{size}-{dtype}", CASES["llama-fp32"].params, "llama3", overrides,
                LOGITS[dtype])
    return sized(case, dim, layers)


def parse_size(size: str) -> tuple[int, int]:
    """``"128x2"`` -> (128, 2); :class:`UsageError` unless a width that is a multiple of 32 (heads of 16,
    8da4w groups of 32) and at least one layer."""
    dim, _, layers = size.partition("x")
    if not (dim.isdigit() and layers.isdigit()) or int(dim) < 32 or int(dim) % 32 or int(layers) < 1:
        raise UsageError(f"size {size!r}: DIMxLAYERS with DIM a multiple of 32 and at least one layer, e.g. 128x2")
    return int(dim), int(layers)


def _choices(value: str | None, known: tuple[str, ...] | None, what: str, check=None) -> list[str] | None:
    if value is None:
        return None
    names = [v for v in value.split(",") if v]
    if not names:
        raise UsageError(f"--{what} names nothing")
    for name in names:
        if known is not None and name not in known:
            raise UsageError(f"unknown {what[:-1]} {name!r}; known: {', '.join(known)}")
        if check is not None:
            check(name)
    return list(dict.fromkeys(names))


def context_for(prefill: int, decode: int) -> tuple[int, int]:
    """export_llm's ``max_seq_length`` and ``max_context_length`` for a prefill and decode steps: a call
    takes fewer tokens than the first, the cache holds the second (a multiple of 128)."""
    seq = max(128, prefill + 1)
    context = 128 * -(-(prefill + decode + 1) // 128)
    return seq, max(seq, context)


# -- the manifest of prepared programs ------------------------------------------------------------------


@dataclass
class Pair:
    """One size and dtype: its two programs (paths relative to the folder), and what the export recorded."""

    size: str
    dtype: str
    stock: str
    edgefuse: str
    export_seconds: float = 0.0
    logits: str = ""
    agree: bool = False
    contents: dict | None = None  # delegates, kernels outside, means, casts of each
    difference: float | None = None  # edgefuse's error against eager at the check's worst step (nearest its bound)
    bound: float | None = None  # what that step allows

    @property
    def key(self) -> str:
        return f"{self.size}:{self.dtype}"


def read_manifest(folder: str) -> tuple[dict, list[Pair]]:
    """The manifest of ``folder`` (its limits and pairs); :class:`UsageError` when there is none, it is not a
    regular file of at most :data:`MANIFEST_BYTES` or not one this command wrote, or a program it names is
    missing."""
    from edgefuse.runtime.files import read_regular

    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise UsageError(f"{folder}: no {MANIFEST} (prepare the programs with --export-only --dir {folder})")
    try:
        text = read_regular(path, MANIFEST_BYTES, "the manifest of prepared programs")
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read {path}: {error}") from error
    try:
        data = json.loads(text)
        limits = {k: int(data[k]) for k in ("max_seq_length", "max_context_length")}
        pairs = [Pair(p["size"], p["dtype"], str(p["stock"]), str(p["edgefuse"]), float(p.get("export_seconds", 0)),
                      str(p.get("logits", "")), bool(p.get("agree", False)), p.get("contents"),
                      p.get("difference"), p.get("bound"))
                 for p in data["pairs"]]
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(f"{path}: not a manifest of this command ({type(error).__name__}: {error})") from error
    for pair in pairs:
        if pair.dtype not in DTYPES:
            raise UsageError(f"{path}: unknown dtype {pair.dtype!r}")
        parse_size(pair.size)
        for name in (pair.stock, pair.edgefuse):
            if os.path.isabs(name) or ".." in name.split(os.sep) or not os.path.isfile(os.path.join(folder, name)):
                raise UsageError(f"{path}: program {name!r} is not a file inside {folder}")
    return limits, pairs


def write_manifest(folder: str, limits: dict, pairs: list[Pair]) -> None:
    """Write the manifest as ``lower`` writes its ``.pte``: a new temporary file renamed over the old one, so
    an interrupted write leaves the old one and a link at either name is replaced, not written through."""
    from edgefuse.runtime.files import replace_atomically

    data = json.dumps({**limits, "pairs": [vars(p) for p in pairs]}, indent=1).encode()
    replace_atomically(os.path.join(folder, MANIFEST), lambda f: f.write(data))


# -- export ---------------------------------------------------------------------------------------------


def export_pairs(folder: str, sizes: list[str], dtypes: list[str], prefill: int, decode: int, say) -> list[Pair]:
    """Write each size's model files and export each dtype stock and with edgefuse into ``folder``; check
    each pair and record it in the manifest (pairs already there for other sizes or dtypes are kept)."""
    from edgefuse.runtime.quiet import quiet_root_logger
    from edgefuse.llm.eager import write_small_model

    seq, context = context_for(prefill, decode)
    limits = {"max_seq_length": seq, "max_context_length": context}
    kept: list[Pair] = []
    if os.path.isfile(os.path.join(folder, MANIFEST)):
        old_limits, kept = read_manifest(folder)
        if old_limits != limits:
            raise UsageError(f"{folder} holds programs exported for {old_limits}, not {limits}: use another --dir")
    extra = (f"export.max_seq_length={seq}", f"export.max_context_length={context}")
    pairs = []
    for size in sizes:
        size_folder = os.path.join(folder, size)
        os.makedirs(size_folder, exist_ok=True)
        say(f"{size}: writing params and a random checkpoint of ExecuTorch's Llama")
        model_files = write_small_model(size_folder, dtype_case(size, "fp32").params)
        for dtype in dtypes:
            case = dtype_case(size, dtype)
            pair_folder = os.path.join(size_folder, dtype)
            os.makedirs(pair_folder, exist_ok=True)
            say(f"{size} {dtype}: export_llm stock, then with edgefuse's lowering")
            start = time.monotonic()
            with quiet_root_logger(), contextlib.redirect_stdout(sys.stderr):
                exports = _exported(case, model_files, pair_folder, extra)
            pair = Pair(size, dtype, os.path.relpath(exports["stock"].path, folder),
                        os.path.relpath(exports["edgefuse"].path, folder), round(time.monotonic() - start, 1))
            check_pair(folder, pair, say, exports["edgefuse"].config)
            pairs.append(pair)
            write_manifest(folder, limits, _merged(kept, pairs))
    return pairs


def _exported(case, model_files, folder: str, extra) -> dict:
    from edgefuse.tools.llm_check import export_programs
    from edgefuse.llm.export import ConfigRejected

    try:
        return export_programs(case, model_files, folder, extra=extra)
    except ConfigRejected as error:
        raise UsageError(f"export_llm rejected {case.name}:\n{error}") from error


def _merged(kept: list[Pair], new: list[Pair]) -> list[Pair]:
    keys = {p.key for p in new}
    return [p for p in kept if p.key not in keys] + new


def check_pair(folder: str, pair: Pair, say, config) -> None:
    """Check both programs of ``pair`` as ``python -m edgefuse.tools.llm_check`` does (against the eager
    model of ``config``, the export's, on a prefill of 8 tokens and 2 decode steps: a float program within
    its dtype's bound of eager and of stock, a quantized one within stock's error plus that bound and the
    rounding floor), and
    record the logits' dtype, whether it is the one asked for, and each program's contents."""
    import torch

    from edgefuse.tools.llm_check import check_programs
    from edgefuse.compare.llm_programs import MAX_BYTES, load_llm_programs, read_llm_program
    from edgefuse.llm.eager import prompt_and_steps
    from edgefuse.llm.latency import run_step
    from edgefuse.llm.pte import read_pte

    paths = [os.path.join(folder, p) for p in (pair.stock, pair.edgefuse)]
    programs = load_llm_programs([(path, read_llm_program(path, MAX_BYTES)) for path in paths], lambda _: None)
    prompt, _ = prompt_and_steps(dtype_case(pair.size, pair.dtype).params["vocab_size"], 8, 0)
    logits = [run_step(p.method, prompt, 0, k) for k, p in enumerate(programs)]
    pair.logits = str(logits[1].dtype).removeprefix("torch.")
    same = logits[0].dtype == logits[1].dtype == getattr(torch, LOGITS[pair.dtype])
    checks = check_programs(dtype_case(pair.size, pair.dtype), dict(zip(("stock", "edgefuse"), paths)), config,
                            prefill=8, decode=2)
    pair.difference, pair.bound = checks["edgefuse"].worst
    pair.agree = bool(same and all(check.matches for check in checks.values()))
    pair.contents = {}
    for how, path in zip(("stock", "edgefuse"), paths):
        c = read_pte(path)
        pair.contents[how] = {"delegates": c.delegate_count, "kernels": c.kernel_count, "means": c.means,
                              "casts": c.casts}
    say(f"{pair.size} {pair.dtype}: logits {pair.logits}, programs agree: {'yes' if pair.agree else 'NO'}")


def export_table(pairs: list[Pair]) -> str:
    from edgefuse.console.tables import format_table

    rows = []
    for p in pairs:
        s, e = p.contents["stock"], p.contents["edgefuse"]
        difference = "-" if p.difference is None else f"{p.difference:.3g} ({p.bound:.3g})"
        rows.append([p.size, p.dtype, p.logits, "yes" if p.agree else "NO", difference, s["delegates"], s["kernels"], s["means"],
                     s["casts"], e["delegates"], e["kernels"], e["means"], e["casts"], f"{p.export_seconds:.0f}"])
    header = ("size", "dtype", "logits", "agree", "edgefuse error (allowed)", "stock delegates", "kernels", "means", "casts",
              "edgefuse delegates", "kernels", "means", "casts", "export s (both)")
    return format_table(header, rows)


# -- timing ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    """A line of the table: one run of a pair (``run`` its number, ``first`` the program loaded first), or
    every run of it pooled (``run`` is ``"all"``, ``first`` empty); ``inputs``, how the programs took their
    inputs (``edgefuse.llm.latency.Inputs``), as the timing read them."""

    pair: Pair
    run: int | str
    first: str
    medians: list[tuple[float, float]]
    ratios: tuple[float, float]
    inputs: Inputs | None = None


def _row(pair: Pair, run: int | str, first: str, timing) -> Row:
    return Row(pair, run, first, [timing.medians(0), timing.medians(1)], timing.ratios(), timing.inputs)


#: The programs of a pair, by their index in a timing.
LABELS = ("stock", "edgefuse")


def pair_programs(folder: str, pair: Pair, args, say) -> list[tuple[str, CheckedPte]]:
    """The ``(path, checked)`` of ``pair``'s two programs, each read and checked within ``--max-bytes`` and held
    open (``edgefuse.compare.llm_programs.CheckedPte``), then
    tried in a child process as the timing runs them (``bench-llm``'s rules: a file refused, or one the
    runtime crashes on, is a :class:`UsageError` naming it)."""
    from edgefuse.compare.llm_programs import read_llm_program, try_llm_programs

    programs = [(os.path.join(folder, p), read_llm_program(os.path.join(folder, p), args.max_bytes))
                for p in (pair.stock, pair.edgefuse)]
    say(f"{pair.size} {pair.dtype}: trying both programs in a child process")
    try_llm_programs(programs, args.prefill, args.decode)
    return programs


def bench_pair(programs: list[tuple[str, CheckedPte]], pair: Pair, args, runs: int, first_run: int, say,
               labels: tuple[str, str] = LABELS) -> list:
    """Time ``pair``'s two programs (:func:`pair_programs`) in ``runs`` runs (``TimedRun``), loaded afresh
    each run with the program loaded first alternating, stock first in the first; the progress names them
    by ``labels``."""
    from edgefuse.compare.llm_programs import failed_steps_named, load_llm_programs, refuse_changed
    from edgefuse.llm.latency import time_runs

    run = first_run

    def load(order):
        nonlocal run
        say(f"{pair.size} {pair.dtype} run {run} ({labels[order[0]]} loaded first): {args.rounds} rounds of each "
            f"program, alternating, after {args.warmup} warm-up rounds")
        run += 1
        return load_llm_programs([programs[k] for k in order], lambda _: None)

    with failed_steps_named([path for path, _ in programs]):
        timed = time_runs(load, len(programs), args.prefill, args.decode, runs, args.rounds, args.warmup)
    refuse_changed(programs)  # a write during the last run's rounds reached what it ran
    return timed


def time_pair(folder: str, pair: Pair, args, say, labels: tuple[str, str] = LABELS) -> list[Row]:
    """The rows of ``pair``: two runs (each program loaded first once), two more for each of ``--repeats``
    when the prefill or decode ratio over the runs (:func:`edgefuse.llm.latency.pooled`) is :data:`REPEAT_AT`
    or above, and the row of all runs; the two programs named by ``labels``."""
    from edgefuse.llm.latency import pooled

    programs = pair_programs(folder, pair, args, say)
    runs = bench_pair(programs, pair, args, 2, 1, say, labels)
    if max(pooled(runs).ratios()) >= REPEAT_AT and args.repeats:
        runs += bench_pair(programs, pair, args, 2 * args.repeats, len(runs) + 1, say, labels)
    rows = [_row(pair, k + 1, labels[run.order[0]], run.timing) for k, run in enumerate(runs)]
    return rows + [_row(pair, "all", "", pooled(runs))]


def latency_table(rows: list[Row]) -> str:
    from edgefuse.console.tables import format_table

    header = ("size", "dtype", "run", "loaded first", "logits", "stock prefill ms", "edgefuse prefill ms", "ratio",
              "stock decode ms/token", "edgefuse decode ms/token", "ratio")
    body = []
    for r in rows:
        (sp, sd), (ep, ed) = r.medians
        body.append([r.pair.size, r.pair.dtype, r.run, r.first or "-", r.pair.logits, f"{sp:.3f}", f"{ep:.3f}",
                     f"{r.ratios[0]:.3f}", f"{sd:.4f}", f"{ed:.4f}", f"{r.ratios[1]:.3f}"])
    return format_table(header, body)


def verdict(rows: list[Row]) -> str:
    """Whether edgefuse is never slower at the median over a pair's runs (each ratio of an ``all`` row, the
    geometric mean of its runs', to two decimals at most 1.00), and the largest such ratio and where it is."""
    pooled_rows = [r for r in rows if r.run == "all"]
    ratio, phase, r = max(((ratio, phase, r) for r in pooled_rows for phase, ratio in zip(PHASES, r.ratios)),
                          key=lambda item: item[0])
    slower = sorted({f"{x.pair.size} {x.pair.dtype} {phase_}" for x in pooled_rows
                     for phase_, value in zip(PHASES, x.ratios) if round(value, 2) > 1.00})
    where = f"largest ratio {ratio:.3f}: {r.pair.size} {r.pair.dtype} {phase} (all runs)"
    if slower:
        return f"edgefuse slower than stock at the median (ratio above 1.00) in: {', '.join(slower)}; {where}"
    return (f"edgefuse never slower than stock at the median (every ratio over all of a pair's runs at most 1.00); "
            f"{where}")


PHASES = ("prefill", "decode")


# -- profile --------------------------------------------------------------------------------------------


def profile_table(folder: str, pair: Pair, args, say, labels: tuple[str, str] = LABELS) -> str:
    """Where each program of ``pair`` spends a prefill and a decode step, side by side, headed by ``labels``
    (the pair's ``stock`` program first)."""
    from edgefuse.compare.llm_programs import failed_steps_named, load_llm_programs
    from edgefuse.console.tables import format_table
    from edgefuse.llm.latency import prompt_for
    from edgefuse.llm.profile import DELEGATE, INSIDE, METHOD, OUTSIDE, profile_prefill_decode

    programs = pair_programs(folder, pair, args, say)
    probe = load_llm_programs(programs[:1], lambda _: None)[0]
    with failed_steps_named([path for path, _ in programs]):
        prompt, steps = prompt_for(probe.method, args.prefill, args.decode)
    del probe
    profiles = []
    for path, checked in programs:
        say(f"profiling {path}: {args.profile_rounds} rounds with ETDump")
        with failed_steps_named([path]):
            profiles.append(profile_prefill_decode(checked.read(), prompt, steps, args.profile_rounds))
    order = {METHOD: 0, DELEGATE: 1, INSIDE: 2, OUTSIDE: 3}
    keys = sorted(set(profiles[0].rows) | set(profiles[1].rows),
                  key=lambda k: (order[k[0]], -max(p.rows[k].prefill_ms + p.rows[k].decode_ms for p in profiles if k in p.rows)))
    body = []
    for key in keys:
        cells = [p.rows.get(key) for p in profiles]
        calls = "/".join(f"{c.prefill_calls}" if c else "0" for c in cells)
        body.append([key[0], key[1], calls,
                     *(f"{c.prefill_ms:.4f}" if c else "0" for c in cells), _delta(cells, "prefill_ms"),
                     *(f"{c.decode_ms:.4f}" if c else "0" for c in cells), _delta(cells, "decode_ms")])
    first, second = labels
    header = ("group", "what", f"calls {first}/{second}", f"{first} prefill ms", f"{second} prefill ms", "difference",
              f"{first} decode ms/token", f"{second} decode ms/token", "difference")
    lines = [format_table(header, body)]
    for phase, attribute in (("prefill", "prefill_ms"), ("decode", "decode_ms")):
        parts = [k for k in keys if k[0] in (INSIDE, OUTSIDE)]
        parts.sort(key=lambda k: -abs(float(_delta([p.rows.get(k) for p in profiles], attribute))))
        lines.append(f"largest differences in the {phase} ({second} - {first}, ms): " + ", ".join(
            f"{k[1]} {_delta([p.rows.get(k) for p in profiles], attribute)}" for k in parts[:3]))
    return "\n".join(lines)


def _delta(cells, attribute: str) -> str:
    values = [getattr(c, attribute) if c else 0.0 for c in cells]
    return f"{values[1] - values[0]:+.4f}"


# -- the command ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from edgefuse.compare.llm_programs import add_max_bytes_argument

    parser = argparse.ArgumentParser(prog="python -m edgefuse.tools.llm_latency", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=None, help=f"DIMxLAYERS, comma-separated (default {','.join(SIZES)}; "
                        "with --bench-only, every size prepared)")
    parser.add_argument("--dtypes", default=None, help=f"of {', '.join(DTYPES)}, comma-separated (default all; "
                        "with --bench-only, every dtype prepared)")
    parser.add_argument("--prefill", type=int, default=100, help="prompt tokens (default 100)")
    parser.add_argument("--decode", type=int, default=32, help="decode steps after the prompt (default 32)")
    parser.add_argument("--threads", type=int, default=1, help="XNNPACK threadpool size (default 1)")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds of each program (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    parser.add_argument("--repeats", type=int, default=1,
                        help=f"further pairs of runs (each program loaded first once) of a pair whose ratio over "
                        f"its first two runs is {REPEAT_AT} or above (default 1)")
    parser.add_argument("--dir", default=None, help="where the programs are written (default: a fresh private "
                        "folder, removed afterwards); needed with --export-only")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--export-only", action="store_true", help="prepare the programs in --dir, time nothing")
    modes.add_argument("--bench-only", metavar="DIR", default=None, help="time the programs prepared in DIR")
    parser.add_argument("--profile", metavar="SIZE:DTYPE", default=None,
                        help="instead of timing, where each program of this pair spends its time (ETDump)")
    parser.add_argument("--profile-rounds", type=int, default=5, help="profiled rounds (default 5)")
    add_max_bytes_argument(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def _check_numbers(args) -> None:
    from edgefuse.compare.llm_programs import check_bench_numbers

    check_bench_numbers(args, (("--repeats", args.repeats, 0), ("--profile-rounds", args.profile_rounds, 1),
                               ("--max-bytes", args.max_bytes, 1)))
    if args.export_only and args.dir is None:
        raise UsageError("--export-only needs --dir DIR (where the programs are kept for --bench-only DIR)")
    if args.bench_only is not None and args.dir is not None:
        raise UsageError("--bench-only DIR reads the programs in DIR: drop --dir")
    if args.export_only and args.profile is not None:
        raise UsageError("--profile times the programs: not with --export-only")


def _selected(pairs: list[Pair], sizes, dtypes, profile) -> list[Pair]:
    chosen = [p for p in pairs if (sizes is None or p.size in sizes) and (dtypes is None or p.dtype in dtypes)]
    if profile is not None:
        chosen = [p for p in pairs if p.key == profile]
    return chosen


def run(args, say) -> int:
    _check_numbers(args)
    sizes = _choices(args.sizes, None, "sizes", parse_size)
    dtypes = _choices(args.dtypes, DTYPES, "dtypes")
    profile = None
    if args.profile is not None:
        size, _, dtype = args.profile.partition(":")
        parse_size(size)
        if dtype not in DTYPES:
            raise UsageError(f"--profile {args.profile}: SIZE:DTYPE with DTYPE one of {', '.join(DTYPES)}")
        profile = f"{size}:{dtype}"
    if args.bench_only is not None:
        folder = args.bench_only
        limits, pairs = read_manifest(folder)
        if args.prefill >= limits["max_seq_length"] or args.prefill + args.decode >= limits["max_context_length"]:
            raise UsageError(f"the programs in {folder} take fewer than {limits['max_seq_length']} tokens a call and "
                             f"{limits['max_context_length']} in all: --prefill {args.prefill} --decode {args.decode} "
                             "does not fit (export them again with these)")
        pairs = _selected(pairs, sizes, dtypes, profile)
        if not pairs:
            raise UsageError(f"{folder} holds no program of the sizes, dtypes or --profile pair asked for")
        return _time_or_profile(folder, pairs, args, profile, say)
    if profile is not None:
        sizes, dtypes = [profile.split(":")[0]], [profile.split(":")[1]]
    sizes, dtypes = sizes or list(SIZES), dtypes or list(DTYPES)
    temporary = args.dir is None
    if temporary:
        from edgefuse.runtime.files import fresh_private_folder

        folder = fresh_private_folder("edgefuse-llm-latency-")
    else:
        from edgefuse.runtime.files import UnsafeFolder, own_folder

        try:
            folder = own_folder(args.dir)
        except (UnsafeFolder, OSError) as error:
            raise UsageError(f"--dir {args.dir}: {error}") from error
    try:
        start = time.monotonic()
        pairs = export_pairs(folder, sizes, dtypes, args.prefill, args.decode, say)
        print(f"exported {len(pairs)} pairs in {time.monotonic() - start:.0f}s into {folder} "
              f"(max_seq_length {context_for(args.prefill, args.decode)[0]}, "
              f"max_context_length {context_for(args.prefill, args.decode)[1]}):")
        print(export_table(pairs))
        status = OK if all(p.agree for p in pairs) else CHECK_FAILED
        if args.export_only:
            print(f"time them on an idle machine: python -m edgefuse.tools.llm_latency --bench-only {folder}")
            return status
        return max(status, _time_or_profile(folder, pairs, args, profile, say))
    finally:
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)


def _time_or_profile(folder: str, pairs: list[Pair], args, profile, say) -> int:
    from edgefuse.runtime import set_threads
    from edgefuse.runtime.timer import conditions as timing_conditions

    threads = set_threads(args.threads)
    conditions = f"executorch.runtime with the LLM custom ops, {timing_conditions(threads)}"
    if profile is not None:
        pair = pairs[0]
        print(f"where the time goes, {pair.size} {pair.dtype}: prefill of {args.prefill} tokens, then {args.decode} "
              f"decode steps; medians over {args.profile_rounds} rounds with ETDump recording (which costs a "
              "little per event: compare the programs, not the totals; XNNPACK times its operators in whole "
              f"microseconds, the rest of a delegate's time is the call beyond its operators); {conditions}")
        print(profile_table(folder, pair, args, say))
        return OK
    rows = [row for pair in pairs for row in time_pair(folder, pair, args, say)]
    print(f"{conditions}; prefill of {args.prefill} tokens at position 0, then {args.decode} decode steps of one "
          f"token; each run loads both programs afresh and times {args.rounds} rounds alternating after {args.warmup} warm-up rounds; two runs a pair, stock loaded first in one and edgefuse "
          "in the other" + (f", and {2 * args.repeats} more for a pair whose ratio over both is {REPEAT_AT} or above"
                            if args.repeats else "") +
          "; medians over rounds, and over every round of a pair's runs on its 'all' line; ratio = edgefuse / stock "
          "(below 1 is faster), of a run's medians, and on the 'all' line the geometric mean of its runs' ratios "
          "(the loaded-first slowdown cancels), which the verdict reads")
    print(latency_table(rows))
    print(verdict(rows))
    status = OK
    if not all(p.agree for p in pairs):
        print("programs whose check failed at export: " + ", ".join(p.key for p in pairs if not p.agree))
        status = CHECK_FAILED
    return status


def main(argv: list[str] | None = None) -> int:
    from edgefuse.console.progress import Progress
    from edgefuse.runtime.blas import pin_blas_threads
    from edgefuse.runtime.quiet import quiet_libraries

    args = build_parser().parse_args(argv)
    quiet_libraries()
    if not args.export_only:  # exports only: torch keeps its threads
        pin_blas_threads()
    say = Progress(enabled=not args.quiet)
    return run_command("python -m edgefuse.tools.llm_latency", run, args, say)


if __name__ == "__main__":
    raise SystemExit(main())
