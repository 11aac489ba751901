"""The command line: ``edgefuse fuzz --cases N --seed S`` (or ``python -m edgefuse.fuzz``): parsing only."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from edgefuse.fuzz.runner import DEFAULT_OUT, Options, run
from edgefuse.fuzz.summary import format_summary


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefuse fuzz",
        description=(
            "Differential fuzzing of edgefuse's RMSNorm recomposition: generate small modules around "
            "RMSNorm (every form, near misses, random casts and neighbours), export them in capture and "
            "edge modes, rewrite them for every backend profile, and compare with eager."
        ),
    )
    parser.add_argument("--cases", type=int, default=200, help="number of generated cases (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="run seed: case i of seed S is always the same module")
    parser.add_argument("--start", type=int, default=0, help="index of the first case (default 0)")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT,
        help=f"directory for reproducer files of failing cases, created only when one fails (default ./{DEFAULT_OUT}); "
        "it must be a folder of yours that other users cannot write",
    )
    parser.add_argument("--no-reproducers", action="store_true", help="write no reproducer files")
    parser.add_argument("--batch", type=int, default=8, help="cases exported side by side in one module (default 8)")
    parser.add_argument(
        "--edge-every", type=int, default=1, metavar="K",
        help="run the two edge modes (to_edge, about a second per call) on cases whose index is a multiple "
        "of K; the others get capture mode only (default 1: every case)",
    )
    parser.add_argument(
        "--hostile-every", type=int, default=0, metavar="K",
        help="also feed the pass damaged graphs (stripped or false metadata, unknown ops, symbolic shapes, "
        "the raw ExportedProgram) of cases whose index is a multiple of K, and the fixed malformed graphs "
        "once (default 0: none)",
    )
    parser.add_argument(
        "--xnnpack-every", type=int, default=0, metavar="K",
        help="also lower cases whose index is a multiple of K with edgefuse's XNNPACK flow and run the .pte "
        "in executorch.runtime (default 0: none)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--shrink", type=int, default=5, help="shrink the first failing case of this many distinct failures")
    parser.add_argument("--max-files", type=int, default=100, help="write at most this many reproducer files")
    parser.add_argument("--progress", type=float, default=30.0, metavar="SECONDS", help="progress line interval")
    parser.add_argument("-q", "--quiet", action="store_true", help="no header or progress lines on stderr")
    parser.add_argument("--replay", type=Path, default=None, metavar="FILE", help="re-check the case(s) of a reproducer file")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer; exit code 0 when no check failed, 1 when one did, 2 for bad arguments."""
    args = _parser().parse_args(argv)
    if args.replay is not None:
        return _replay(args.replay)
    if min(args.cases, args.batch, args.edge_every, args.jobs) < 1 or min(
        args.hostile_every, args.xnnpack_every, args.start
    ) < 0:
        print("--cases, --batch, --edge-every and --jobs take positive numbers, --hostile-every, "
              "--xnnpack-every and --start non-negative ones", file=sys.stderr)
        return 2
    options = Options(
        seed=args.seed,
        cases=args.cases,
        start=args.start,
        batch=args.batch,
        edge_every=args.edge_every,
        hostile_every=args.hostile_every,
        xnnpack_every=args.xnnpack_every,
        malformed=args.hostile_every > 0,
        jobs=args.jobs,
        out=None if args.no_reproducers else args.out,
        shrink=args.shrink,
        max_files=args.max_files,
        progress_seconds=float("inf") if args.quiet else args.progress,
    )
    extras = [
        f"edge modes on {'every case' if args.edge_every == 1 else f'cases whose index is a multiple of {args.edge_every}'}"
    ]
    if args.hostile_every:
        extras.append(f"hostile graphs on multiples of {args.hostile_every} and the malformed set")
    if args.xnnpack_every:
        extras.append(f"XNNPACK on multiples of {args.xnnpack_every}")
    if not args.quiet:
        print(
            f"edgefuse fuzz: seed {args.seed}, {args.cases} cases from {args.start}, batches of {args.batch}; "
            + "; ".join(extras),
            file=sys.stderr,
            flush=True,
        )
    from edgefuse.runtime.files import UnsafeFolder, own_folder

    try:
        if options.out is not None and os.path.lexists(options.out):
            own_folder(options.out)  # before the run: a folder another user planted is refused up front
        summary = run(options)
    except UnsafeFolder as error:
        print(f"cannot write reproducers to {options.out}: {error.strerror}; name a folder of your own with --out",
              file=sys.stderr)
        return 2
    print(format_summary(summary))
    return 1 if summary.failed else 0


def _replay(path: Path) -> int:
    """Re-check the cases a reproducer file holds, with every check the fuzzer has."""
    from edgefuse.fuzz.check import CHECKS, check_name
    from edgefuse.fuzz.edge_programs import cached_cia_ops
    from edgefuse.fuzz.reproducer import read_specs
    from edgefuse.fuzz.units import run_unit

    try:
        specs = read_specs(path)
    except (OSError, SyntaxError, ValueError) as error:
        print(f"cannot replay {path}: {error}", file=sys.stderr)
        return 2
    failed = unchecked = False
    with cached_cia_ops():
        for spec in specs:
            [result] = run_unit([spec], CHECKS)
            print(f"{spec.name}: {len(result.checks)} checks, rebuilt {result.rebuilt}, left {result.left}"
                  + (f", unexportable: {result.unexportable}" if result.unexportable else ""))
            for note in result.amplified:
                print(f"  amplified (not a finding): {note}")
            for finding in result.findings:
                failed = True
                print(f"  {finding.kind} {check_name(finding.check)}: {finding.detail.strip()[:500]}")
            unchecked |= not result.checks
    if unchecked and not failed:
        print(f"cannot replay {path}: a case ran no check (see above): its SPEC is not one the fuzzer wrote",
              file=sys.stderr)
        return 2
    return 1 if failed else 0
