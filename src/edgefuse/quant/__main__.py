"""``python -m edgefuse.quant``: the quantized flows on the tiny models, as two tables.

Slow (each XNNPACK lowering of a tiny transformer takes minutes on a small shared CPU): pick models,
dtypes and flows with the options. Progress goes to stderr, tables to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgefuse.quant", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-llama,tiny-qwen3,tiny-gemma3,tiny-t5")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="dtypes of the QNN table")
    parser.add_argument("--xnnpack-dtypes", default="float32,float16", help="dtypes of the XNNPACK table")
    parser.add_argument("--schemes", default="qs8,8da4w", help="XNNPACK quantization schemes")
    parser.add_argument("--no-qnn", action="store_true", help="skip the QNN table")
    parser.add_argument("--no-xnnpack", action="store_true", help="skip the XNNPACK table")
    parser.add_argument("--quant-dtype", default="use_16a8w", help="QNN QuantDtype name (default use_16a8w)")
    parser.add_argument("--per-norm", action="store_true", help="also print how each norm was quantized")
    parser.add_argument("--json", metavar="PATH", help="also write every measurement as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    from edgefuse.models import MODEL_NAMES
    from edgefuse.quant.xnnpack import SCHEMES

    models = _choices(parser, "--models", args.models, MODEL_NAMES)
    dtypes = _choices(parser, "--dtypes", args.dtypes, DTYPES)
    xnnpack_dtypes = _choices(parser, "--xnnpack-dtypes", args.xnnpack_dtypes, DTYPES)
    schemes = _choices(parser, "--schemes", args.schemes, SCHEMES)

    from edgefuse.progress import Progress, quiet_libraries

    quiet_libraries()
    import torch

    from edgefuse.quant import table

    say = Progress(enabled=not args.quiet)
    torch.set_num_threads(1)
    qnn_rows, xnn_rows = [], []
    status = 0
    if not args.no_qnn:
        from edgefuse.quant.qnn import qnn_available

        reason = qnn_available()
        if reason is not None:
            print(f"QNN: not measured: {reason} (--no-qnn measures XNNPACK alone)")
            status = 1
        else:
            for model in models:
                for dtype in dtypes:
                    qnn_rows.append(table.qnn_row(model, getattr(torch, dtype), say=say, quant_dtype=args.quant_dtype))
            print(f"QNN capture ({args.quant_dtype}, min/max observers), converted programs run in eager:")
            print(table.qnn_tables(qnn_rows))
            for row in qnn_rows:
                for mode, why in row.failed.items():
                    print(f"  {row.model} {row.dtype} {mode}: FAILED {why}")
                    status = 1
                changes = table.own_error_changes(row)
                for key in changes.higher:
                    print(f"  {row.model} {row.dtype}: rebuilt {key} has a higher own error than not rebuilt")
                    status = 1
                for key in changes.missing:
                    print(f"  {row.model} {row.dtype}: rebuilt {key} has no own error measured in both flows")
                    status = 1
                for path, why in row.left:
                    print(f"  {row.model} {row.dtype}: edgefuse left {path} decomposed: {why}")
                if args.per_norm:
                    for key, hows in row.per_norm.items():
                        print(f"  {row.model} {row.dtype} {key}")
                        for mode, how in hows.items():
                            print(f"      {mode:8s} {how}")
            print()
    if not args.no_xnnpack:
        for model in models:
            for dtype in xnnpack_dtypes:
                for scheme in schemes:
                    xnn_rows.append(table.xnnpack_row(model, getattr(torch, dtype), scheme, say=say))
        print("XNNPACK, each .pte run in executorch.runtime:")
        print(table.xnnpack_table(xnn_rows))
        for row in xnn_rows:
            for how, why in row.failed.items():
                print(f"  {row.model} {row.dtype} {row.scheme} {how}: FAILED {why}")
                status = 1
            if row.means_outside.get("edgefuse"):
                print(f"  {row.model} {row.dtype} {row.scheme}: {row.means_outside['edgefuse']} means left outside by edgefuse")
                status = 1
            for line in row.norms:
                print(f"  {row.model} {row.dtype} {row.scheme} norms: {line}")
    if args.json:
        with open(args.json, "w") as f:
            measured = {"qnn": [asdict(r) for r in qnn_rows], "xnnpack": [asdict(r) for r in xnn_rows]}
            json.dump(_json_safe(measured), f, indent=1, allow_nan=False)
    return status


DTYPES = ("float32", "float16", "bfloat16")


def _choices(parser: argparse.ArgumentParser, option: str, value: str, known) -> list[str]:
    """The comma-separated names of ``value``, each one of ``known``; a usage error (exit 2) otherwise."""
    names = [name for name in value.split(",") if name]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        parser.error(f"{option}: {'unknown ' + ', '.join(unknown) if unknown else 'nothing given'}; choose from {', '.join(known)}")
    return names


def _json_safe(value):
    """``value`` with every non-finite float written as the string ``"inf"``, ``"-inf"`` or ``"nan"``:
    JSON has no such numbers, and a NaN error must not read as a valid one."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
