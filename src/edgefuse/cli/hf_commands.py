"""The ``export-hf`` command: Hugging Face's export flow (optimum-executorch) with edgefuse's recipe.

It runs optimum's ``main_export`` on a model folder with ``edgefuse-xnnpack`` (or stock's ``xnnpack``) through
:func:`edgefuse.hf.export`, and prints what the program holds: its delegates, the kernels it calls outside them
by op, the means outside and the casts outside, float casts (a norm's) apart from integer ones;
``--compare`` exports with stock's recipe too and prints both side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Callable

from edgefuse.inputs.errors import OK, Unavailable, UsageError

Say = Callable[[str], None]

#: The name ``--compare`` gives stock's program, beside edgefuse's ``model.pte``.
STOCK_NAME = "model.stock.pte"

CASTS_NOTE = (
    "float casts are those between floating-point dtypes (a norm's, around its float32 arithmetic); integer "
    "casts turn integers into floats or other integers, such as the rotary position ids (int64 to float32) "
    "and the cache position (int32 to int64): no norm's, and XNNPACK has no int64 to take them, stock or edgefuse"
)


def add_export_hf_arguments(parser: argparse.ArgumentParser) -> None:
    """``MODEL_DIR``, ``-o``, ``--recipe``, ``--compare`` and optimum's own options, spelt as optimum-cli spells
    them (``--use_custom_sdpa``, ``--output_dir``) so that its command lines carry over, with its choices."""
    from edgefuse.hf.options import EDGEFUSE_RECIPE, OPTIONS, RECIPES

    parser.add_argument("model_dir", metavar="MODEL_DIR",
                        help="a folder a Hugging Face model was saved in with save_pretrained (config.json, weights)")
    parser.add_argument("-o", "--output_dir", required=True, metavar="DIR",
                        help="where to write model.pte (and model.stock.pte with --compare); made when missing")
    parser.add_argument("--recipe", choices=RECIPES, default=EDGEFUSE_RECIPE,
                        help=f"the recipe: {EDGEFUSE_RECIPE} (default), or optimum-executorch's own xnnpack")
    parser.add_argument("--compare", action="store_true",
                        help=f"also export with stock's xnnpack recipe (kept as {STOCK_NAME}) and print both side by side")
    optimum = parser.add_argument_group("optimum-executorch's options (those of `optimum-cli export executorch`)")
    for option in OPTIONS.values():
        flag = f"--{option.name}"
        if option.kind is bool:
            optimum.add_argument(flag, action="store_true", help=option.help)
        elif option.kind is int:
            optimum.add_argument(flag, type=int, metavar="N", help=option.help)
        else:
            optimum.add_argument(flag, choices=option.choices, help=option.help)


def export_hf_command(args, say: Say) -> int:
    """``edgefuse export-hf MODEL_DIR -o DIR [--recipe R] [--compare] [optimum's options]``."""
    from edgefuse.hf.flow import check_export, check_installed
    from edgefuse.hf.options import EDGEFUSE_RECIPE, OPTIONS, STOCK_RECIPE, HfInputError

    options = {name: getattr(args, name) for name in OPTIONS}
    runs = [(args.recipe, "model.pte")]
    if args.compare:
        if args.recipe != EDGEFUSE_RECIPE:
            raise UsageError(f"--compare exports with both recipes; leave out --recipe {args.recipe}")
        runs = [(STOCK_RECIPE, STOCK_NAME), (EDGEFUSE_RECIPE, "model.pte")]
    try:
        for recipe, name in runs:
            model_type, checked = check_export(args.model_dir, args.output_dir, recipe, name, **options)
        check_installed(checked)
    except HfInputError as error:
        raise UsageError(str(error)) from error
    except ImportError as error:
        raise Unavailable(str(error)) from error
    exports = [_export(args, recipe, name, options, say) for recipe, name in runs]
    print(f"{args.model_dir}: {model_type}, task text-generation, options: "
          + (", ".join(f"{k}={v}" for k, v in exports[0].options.items()) or "none"))
    for export in exports:
        line = f"{export.recipe}: exported in {export.seconds:.1f} s"
        if export.record is not None:
            line += (f"; edgefuse substituted {export.record.substituted} means, casts, scalar adds and tanh GELUs, "
                     f"{export.record.restored} of them left outside a delegate and restored")
        print(line)
    print(format_contents(exports))
    print(CASTS_NOTE)
    print("wrote " + " and ".join(export.path for export in exports))
    return OK


def _export(args, recipe: str, name: str, options: dict, say: Say):
    """One export with ``recipe``, optimum's and transformers' output sent to stderr (stdout holds the result
    alone), their log records below ERROR dropped; the library's refusals become the command's."""
    from edgefuse.hf.flow import ModelRejected, export
    from edgefuse.hf.options import HfInputError
    from edgefuse.runtime.quiet import quiet_root_logger

    say(f"exporting {args.model_dir} with optimum-executorch's main_export and the {recipe} recipe")
    try:
        with quiet_root_logger(), contextlib.redirect_stdout(sys.stderr):
            return export(args.model_dir, args.output_dir, recipe, name=name, **options)
    except (HfInputError, ModelRejected) as error:
        raise UsageError(str(error)) from error


def format_contents(exports) -> str:
    """The side-by-side table of the programs' delegates, means and casts outside, and kernels by op."""
    from edgefuse.cli.llm_commands import contents_rows
    from edgefuse.console.tables import format_table
    from edgefuse.llm.pte import read_pte

    programs = [(f"{e.recipe} ({e.path})", read_pte(e.path)) for e in exports]
    header, rows = contents_rows(programs)
    at = next(i for i, row in enumerate(rows) if row[0] == "kernels outside")
    rows[at:at] = [
        ["means outside", *(c.means for _, c in programs)],
        ["float casts outside", *(c.float_casts for _, c in programs)],
        ["integer casts outside", *(c.integer_casts for _, c in programs)],
    ]
    return format_table(header, rows)
