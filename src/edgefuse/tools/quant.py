"""``python -m edgefuse.tools.quant``: the quantized flows on the tiny models, as two tables.

Slow (each XNNPACK lowering of a tiny transformer takes minutes on a small shared CPU): pick models,
dtypes and flows with the options. Progress goes to stderr, tables to stdout. Exit status: 0 when every
verdict holds, 1 when one fails (a flow failed, a rebuilt norm's own error is higher than not rebuilt
or was not measured, edgefuse left a mean outside an XNNPACK delegate), 2 for bad options, 3 when the
QNN quantizer cannot be imported and nothing else failed (``--no-qnn`` measures XNNPACK alone).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict

from edgefuse.inputs.errors import CHECK_FAILED, OK, UNAVAILABLE

DTYPES = ("float32", "float16", "bfloat16")


def main(argv: list[str] | None = None) -> int:
    description = __doc__.splitlines()[0].replace("``", "")
    parser = argparse.ArgumentParser(prog="python -m edgefuse.tools.quant", description=description)
    parser.add_argument("--models", default="tiny-llama,tiny-qwen3,tiny-gemma3,tiny-t5",
                        help="comma-separated built-in models (default %(default)s)")
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
    if args.no_qnn and args.no_xnnpack:
        parser.error("--no-qnn and --no-xnnpack leave nothing to measure")
    if args.json and (os.path.isdir(args.json) or not os.path.isdir(os.path.dirname(os.path.abspath(args.json)))):
        parser.error(f"--json {args.json}: not a file in an existing directory")

    from edgefuse.console.progress import Progress
    from edgefuse.runtime.quiet import quiet_libraries, quiet_root_logger

    quiet_libraries()
    from edgefuse.inputs.models import MODEL_NAMES
    from edgefuse.qnn.quantizer import QUANT_DTYPES
    from edgefuse.xnnpack.quantizer import SCHEMES

    models = _choices(parser, "--models", args.models, MODEL_NAMES)
    dtypes = _choices(parser, "--dtypes", args.dtypes, DTYPES)
    xnnpack_dtypes = _choices(parser, "--xnnpack-dtypes", args.xnnpack_dtypes, DTYPES)
    schemes = _choices(parser, "--schemes", args.schemes, SCHEMES)
    _choices(parser, "--quant-dtype", args.quant_dtype, QUANT_DTYPES)

    import torch

    from edgefuse.compare import quant_tables as table

    say = Progress(enabled=not args.quiet)
    torch.set_num_threads(1)
    status = OK
    # XNNPACK first: importing the QNN quantizer loads ExecuTorch's quantized kernels library, whose
    # out variants would let programs serialize that do not without it.
    xnn_rows = [] if args.no_xnnpack else [
        table.xnnpack_row(model, getattr(torch, dtype), scheme, say=say)
        for model in models for dtype in xnnpack_dtypes for scheme in schemes
    ]
    qnn_rows, qnn_missing = [], None
    if not args.no_qnn:
        from edgefuse.qnn.quantizer import qnn_available

        qnn_missing = qnn_available()
        if qnn_missing is None:
            with quiet_root_logger():  # the Qualcomm code's SDK set-up notes and deprecations, per model
                qnn_rows = [table.qnn_row(model, getattr(torch, dtype), say=say, quant_dtype=args.quant_dtype)
                            for model in models for dtype in dtypes]
    if qnn_missing is not None:
        print(f"QNN: not measured: {qnn_missing} (--no-qnn measures XNNPACK alone)")
    if qnn_rows:
        print(f"QNN capture ({args.quant_dtype}, min/max observers), converted programs run in eager:")
        print(table.qnn_tables(qnn_rows))
        status = max(status, _qnn_verdicts(qnn_rows, args.per_norm))
        print()
    if xnn_rows:
        print("XNNPACK, each .pte run in executorch.runtime:")
        print(table.xnnpack_table(xnn_rows))
        status = max(status, _xnnpack_verdicts(xnn_rows))
    if status == OK and qnn_missing is not None:
        status = UNAVAILABLE  # a failed verdict says more than a table that could not be made
    if args.json:
        measured = {"qnn": [asdict(r) for r in qnn_rows], "qnn_unavailable": qnn_missing,
                    "xnnpack": [asdict(r) for r in xnn_rows]}
        text = json.dumps(_json_safe(measured), indent=1, allow_nan=False)
        with open(args.json, "w") as f:
            f.write(text)
    return status


def _qnn_verdicts(rows, per_norm: bool) -> int:
    """Print what each QNN row says beyond its table cells; CHECK_FAILED if a verdict fails."""
    from edgefuse.compare.quant_tables import own_error_changes

    status = OK
    for row in rows:
        for mode, why in row.failed.items():
            print(f"  {row.model} {row.dtype} {mode}: FAILED {why}")
            status = CHECK_FAILED
        changes = own_error_changes(row)
        for key in changes.higher:
            print(f"  {row.model} {row.dtype}: rebuilt {key} has a higher own error than not rebuilt")
            status = CHECK_FAILED
        for key in changes.missing:
            print(f"  {row.model} {row.dtype}: rebuilt {key} has no own error measured in both flows")
            status = CHECK_FAILED
        for path, why in row.left:
            print(f"  {row.model} {row.dtype}: edgefuse left {path} decomposed: {why}")
        if per_norm:
            for key, hows in row.per_norm.items():
                print(f"  {row.model} {row.dtype} {key}")
                for mode, how in hows.items():
                    print(f"      {mode:8s} {how}")
    return status


def _xnnpack_verdicts(rows) -> int:
    """Print what each XNNPACK row says beyond its table cells; CHECK_FAILED if a verdict fails."""
    status = OK
    for row in rows:
        for how, why in row.failed.items():
            print(f"  {row.model} {row.dtype} {row.scheme} {how}: FAILED {why}")
            status = CHECK_FAILED
        if row.means_outside.get("edgefuse"):
            print(f"  {row.model} {row.dtype} {row.scheme}: {row.means_outside['edgefuse']} means left outside by edgefuse")
            status = CHECK_FAILED
        for line in row.norms:
            print(f"  {row.model} {row.dtype} {row.scheme} norms: {line}")
    return status


def _choices(parser: argparse.ArgumentParser, option: str, value: str, known) -> list[str]:
    """The comma-separated names of ``value`` (spaces ignored, each once), each one of ``known``; a
    usage error (exit 2) otherwise."""
    names = list(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        problem = "unknown " + ", ".join(map(repr, unknown)) if unknown else "nothing given"
        parser.error(f"{option}: {problem}; choose from {', '.join(known)}")
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
