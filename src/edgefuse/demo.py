"""``edgefuse demo``: tiny Qwen3 from an embedded config, its norms rebuilt for QNN, lowered for XNNPACK.

No arguments and no network: the model is built from the config in :mod:`edgefuse.models` with random
weights. In float32 and float16 the demo exports it, converts it to the edge dialect and rebuilds its
RMSNorms for QNN, printing one row per norm (with the error of the norm's output against eager); then
it lowers the float16 program for XNNPACK twice, stock and with edgefuse, runs both ``.pte`` files in
``executorch.runtime`` and prints the delegate counts, with a delegate map written to a temporary
directory.

XNNPACK lowering is the slow part (tens of seconds of one core per lowering of this model), so the
demo lowers one dtype, float16, where edgefuse changes most (stock splits its delegate at every norm's
casts and mean; ``edgefuse lower tiny-qwen3 --dtype float32 -o out.pte`` shows float32), and runs the
stock half in a forked worker (:mod:`edgefuse.background`) while this process does the edgefuse half.
"""

from __future__ import annotations

import os
import tempfile

import torch

from edgefuse.background import Background
from edgefuse.errors import CHECK_FAILED, OK, UNAVAILABLE, Unavailable
from edgefuse.flows import Lowered, comparison_lines, flat_tensors, lower_to_pte, run_and_check
from edgefuse.modelspec import resolve
from edgefuse.progress import Progress
from edgefuse.report import Report, build_report, format_report

MODEL = "tiny-qwen3"
XNNPACK_DTYPE = torch.float16


def map_path() -> str:
    """Where the demo writes its delegate map: a fixed folder under the system's temporary directory."""
    directory = os.path.join(tempfile.gettempdir(), "edgefuse-demo")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, f"{MODEL}-{_name(XNNPACK_DTYPE)}.delegates.svg")


def run(say: Progress | None = None) -> int:
    """Run the demo, printing results to stdout and progress to ``say``; returns the exit code."""
    say = say or Progress(enabled=False)
    print(f"edgefuse demo: {MODEL}, a 2-layer Qwen3 built from a config embedded in edgefuse, random weights")
    with Background() as background:
        other_half = background.submit(_float16_qnn_and_stock, say.start, say.enabled)

        print("\n1. Rebuilding the decomposed RMSNorms for QNN, in the edge program\n")
        float32 = _qnn_report(torch.float32, say)
        print(format_report(float32), flush=True)

        say(f"building and exporting {MODEL} in {_name(XNNPACK_DTYPE)}")
        spec = resolve(MODEL, XNNPACK_DTYPE)
        program = spec.export()
        unavailable = None
        try:
            ours = lower_to_pte(program, "edgefuse", say)
        except Unavailable as error:
            ours, unavailable = None, error
        say("waiting for the worker (QNN in float16, stock XNNPACK lowering)")
        float16, stock = other_half.result()

    print()
    print(format_report(float16))
    ok = float32.ok and float16.ok

    print(f"\n2. Lowering the {_name(XNNPACK_DTYPE)} program for XNNPACK, stock and with edgefuse, and running "
          "both .pte in executorch.runtime\n")
    say("running both programs in executorch.runtime")
    expected = flat_tensors(spec.eager())
    run_and_check(stock, spec.inputs, expected)
    if ours is not None:
        run_and_check(ours, spec.inputs, expected, stock)
    print("\n".join(comparison_lines(stock, ours)))
    if unavailable is not None:
        print(f"  edgefuse: {unavailable}")
        return UNAVAILABLE
    ok &= stock.ok and ours.ok
    print(f"  delegates: {stock.summary.delegates} stock -> {ours.summary.delegates} edgefuse; ops outside: "
          f"{len(stock.summary.outside)} -> {len(ours.summary.outside)}")

    from edgefuse.delegate_map import write

    path = write(map_path(), [stock.summary, ours.summary], f"delegate map: {MODEL} ({_name(XNNPACK_DTYPE)})")
    print(f"  delegate map (open it in a browser): {path}")
    return OK if ok else CHECK_FAILED


def _qnn_report(dtype: torch.dtype, say) -> Report:
    say(f"building and exporting {MODEL} in {_name(dtype)}")
    spec = resolve(MODEL, dtype)
    return build_report(spec, backend="qnn", stage="edge", progress=say, program=spec.export())


def _float16_qnn_and_stock(start: float, enabled: bool) -> tuple[Report, Lowered]:
    """The worker's half: the float16 QNN report and the stock XNNPACK lowering of the float16 program."""
    say = Progress(enabled=enabled)
    say.start = start
    worker = lambda what: say(f"(worker) {what}")  # noqa: E731
    report = _qnn_report(torch.float16, worker)
    spec = resolve(MODEL, XNNPACK_DTYPE)
    stock = lower_to_pte(spec.export(), "stock", worker)
    return report, stock


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


if __name__ == "__main__":  # ``python -m edgefuse.demo``, as the README said before ``edgefuse demo``
    from edgefuse.cli import main

    raise SystemExit(main(["demo"]))
