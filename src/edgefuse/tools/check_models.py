"""Acceptance check on the tiny transformers models: every norm and mean inside the delegate, and eager numerics.

``python -m edgefuse.tools.check_models [--models tiny-llama,...] [--dtypes float32,float16] [--stock]``

For each model and dtype: build it with :func:`edgefuse.inputs.models.build_model`, export, lower with
:func:`edgefuse.xnnpack.lower` (default options), and list what the top-level graph still runs outside
a delegate. A *norm op* is any op whose innermost ``nn_module_stack`` entry is a norm module (a class
whose name ends in ``Norm``: ``LlamaRMSNorm``, ``T5LayerNorm``, ``Gemma3RMSNorm`` ...); its casts are
norm casts. The check fails if any ``mean.dim`` or norm op is left outside, or if the ``.pte``, run in
the released ``executorch.runtime``, differs from eager by more than the dtype's tolerance
(:func:`edgefuse.core.verify.tolerance` at the units in the last place of the largest logit that
:data:`edgefuse.core.verify.TOLERANCES` allows ``model logits``; the models stack tens of ops, each of which may round once differently in the delegate). ``--stock`` also
lowers with stock ``XnnpackPartitioner`` and prints its figures for comparison.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

if __name__ == "__main__":  # run as a command: torchao and torch log warnings as they are imported below
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()

if TYPE_CHECKING:
    import torch

DEFAULT_MODELS = ("tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-t5", "tiny-olmo2")
DTYPES = ("float32", "float16", "bfloat16")


def _norm_module(node) -> str | None:
    from edgefuse.core._fx import module_class_name

    name = module_class_name(node)
    return name if name is not None and name.endswith("Norm") else None


def outside_report(manager) -> tuple[list[str], list[str], int]:
    """(means outside, norm ops outside as ``op in Module``, count of all ops outside) of a lowered program."""
    from edgefuse.core._fx import call_name, nodes_outside

    means, norm_ops = [], []
    outside = nodes_outside(manager)
    for node in outside:
        name = call_name(node)
        if "mean" in name:
            means.append(name)
        module = _norm_module(node)
        if module:
            norm_ops.append(f"{name} in {module}")
    return means, norm_ops, len(outside)


def check(name: str, dtype: torch.dtype, stock: bool, out=sys.stdout) -> bool:
    import torch
    from torch.export import export

    from edgefuse.core._fx import dtype_name
    from edgefuse.core.verify import TOLERANCES, finite_tolerance, max_error
    from edgefuse.inputs.models import build_model
    from edgefuse.xnnpack.inspect import lowered_modules, run_pte, to_pte
    from edgefuse.xnnpack.lowering import lower, lower_stock

    module, inputs = build_model(name, dtype, 0)
    with torch.no_grad():
        expected = module(*inputs)
    allowed = finite_tolerance(dtype, expected, TOLERANCES["model logits"].ulps)
    rows = []
    lowerings = [("edgefuse", lambda ep: lower(ep))]
    if stock:
        lowerings.append(("stock", lower_stock))
    ok = True
    for label, how in lowerings:
        start = time.monotonic()
        manager = how(export(module, inputs))
        means, norm_ops, count = outside_report(manager)
        actual = run_pte(to_pte(manager), list(inputs))[0]
        error = max_error(expected, actual)
        passed = not means and not norm_ops and error <= allowed and actual.shape == expected.shape
        if label == "edgefuse":
            ok = passed
        rows.append(
            f"{name:<12} {dtype_name(dtype):<8} {label:<8} delegates {len(lowered_modules(manager)):>3}  "
            f"ops outside {count:>3}  means outside {len(means):>2}  norm ops outside {len(norm_ops):>2}  "
            f"max error {error:.3g} (allowed {allowed:.3g})  {'PASS' if passed else 'FAIL'}  "
            f"[{time.monotonic() - start:.0f}s]"
        )
        if norm_ops and label == "edgefuse":
            rows.append("    norm ops outside: " + ", ".join(sorted(set(norm_ops))))
    for row in rows:
        print(row, file=out, flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    description = __doc__.split("\n")[0].replace("``", "")
    parser = argparse.ArgumentParser(prog="python -m edgefuse.tools.check_models", description=description)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--stock", action="store_true", help="also lower with stock XnnpackPartitioner")
    args = parser.parse_args(argv)
    names = args.dtypes.split(",")
    for d in names:
        if d not in DTYPES:
            parser.error(f"unknown dtype {d!r}: choose float32, float16 or bfloat16")
    import torch

    dtypes = [getattr(torch, d) for d in names]
    torch.set_num_threads(1)
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()  # every export warns (FutureWarnings of torch's pytree): not the check's business
    try:
        from edgefuse.inputs.models import MODEL_NAMES
    except ImportError as error:
        print(f"edgefuse.inputs.models is not available ({error}); install edgefuse[models]", file=sys.stderr)
        return 2
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODEL_NAMES]
    if unknown:
        parser.error(f"unknown models {', '.join(unknown)}; known: {', '.join(MODEL_NAMES)}")
    ok = all([check(m, d, args.stock) for m in models for d in dtypes])
    print("all passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
