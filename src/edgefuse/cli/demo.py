"""``edgefuse demo``: tiny Qwen3 from an embedded config, its norms rebuilt for QNN, lowered for XNNPACK.

No arguments and no network: the model is built from the config in :mod:`edgefuse.inputs.models` with random
weights and one decoder layer, which holds every kind of norm Qwen3 has (the input and post-attention
norms, and the q and k norms inside attention), followed by the final norm. The demo exports it once in
float32 and once in float16. In each, it rebuilds the RMSNorms for QNN in the captured graph, the graph
QNN's quantizer works on, and prints one row per norm with the error of the norm's output against
eager. Then it lowers the float16 program for XNNPACK twice, stock and with edgefuse, runs both ``.pte``
files in ``executorch.runtime``, checks them against eager and prints the delegate counts, with a
delegate map written to a new private folder under the temporary directory.

XNNPACK lowering is the slow part, so the demo lowers one dtype, float16, where edgefuse changes most
(stock splits its delegate at every norm's casts and mean; ``edgefuse lower tiny-qwen3 --dtype float32
-o out.pte`` shows float32). It builds the XNNPACK backend's pattern graphs once
(:func:`edgefuse.compare.stock_and_edgefuse.build_xnnpack_patterns`), then forks a worker (:mod:`edgefuse.runtime.background`)
that lowers stock while this process rebuilds the QNN norms and lowers with edgefuse. No step runs
twice: one export per dtype serves every use of that dtype, and the eager run that the float16 norm
table compares with is also the reference for both ``.pte`` files.
"""

from __future__ import annotations

import os
import tempfile

import torch
from torch.export import ExportedProgram

from edgefuse.core._fx import dtype_name
from edgefuse.runtime.background import Background
from edgefuse.inputs.errors import CHECK_FAILED, OK, UNAVAILABLE, Unavailable, UsageError
from edgefuse.runtime.files import fresh_private_folder, write_text
from edgefuse.compare.pte_checks import CheckedProgram, comparison_lines, flat_tensors, lower_to_pte, run_and_check
from edgefuse.compare.stock_and_edgefuse import build_xnnpack_patterns
from edgefuse.inputs.modelspec import ModelSpec
from edgefuse.console.progress import Progress
from edgefuse.compare.report import Report, build_report, format_report

MODEL = "tiny-qwen3"
LAYERS = 1  # `edgefuse report tiny-qwen3` builds the config's two
XNNPACK_DTYPE = torch.float16

#: The float16 program, for the worker: a forked worker inherits it, where an argument would be pickled.
_for_worker: dict[str, ExportedProgram] = {}


def map_path() -> str:
    """Where the demo writes its delegate map: a new folder under the system's temporary directory that
    only this user can enter (a fixed name there could be another user's folder, or hold their symlink)."""
    try:
        directory = fresh_private_folder("edgefuse-demo-")
    except OSError as error:
        raise UsageError(
            f"the demo writes its delegate map in a new folder under {tempfile.gettempdir()}, which cannot be "
            f"made: {error.strerror or error}; point TMPDIR at a folder you can write"
        ) from error
    return os.path.join(directory, f"{MODEL}-{dtype_name(XNNPACK_DTYPE)}.delegates.svg")


def run(say: Progress | None = None) -> int:
    """Run the demo, printing results to stdout and progress to ``say``; returns the exit code."""
    destination = map_path()  # before the work: a folder that cannot be made is the user's to fix
    try:
        return _run(destination, say or Progress(enabled=False))
    finally:
        if not os.path.exists(destination):  # nothing written: leave no empty folder behind
            os.rmdir(os.path.dirname(destination))


def demo_command(args, say: Progress) -> int:
    """``edgefuse demo``: the demo, and how long it took."""
    code = run(say)
    say(f"demo done in {say.elapsed():.1f}s")
    return code


def _run(destination: str, say: Progress) -> int:
    # One intra-op thread: no OpenMP pool is started for the forked worker to inherit, and the worker and
    # this process have a core each.
    torch.set_num_threads(1)
    print(f"edgefuse demo: {MODEL} with {LAYERS} decoder layer (input, post-attention, q and k norms) and "
          f"the final norm, built from a config embedded in edgefuse, random weights")

    say(f"building {MODEL} and exporting it in {dtype_name(XNNPACK_DTYPE)}")
    spec16 = _build(XNNPACK_DTYPE)
    program16 = spec16.export()
    say("building the XNNPACK backend's pattern graphs, once for both lowerings")
    build_xnnpack_patterns()
    _for_worker["program"] = program16
    try:
        with Background() as background:
            pending = background.submit(_stock_lowering, say.start, say.enabled)

            print("\n1. Rebuilding the decomposed RMSNorms for QNN, in the captured graph its quantizer sees\n")
            say(f"building {MODEL} and exporting it in float32")
            spec32 = _build(torch.float32)
            float32, _ = _qnn_report(spec32, spec32.export(), say)
            print(format_report(float32), flush=True)
            float16, eager16 = _qnn_report(spec16, program16, say)
            print()
            print(format_report(float16), flush=True)

            unavailable = None
            try:
                ours = lower_to_pte(program16, "edgefuse", say)
            except Unavailable as error:
                ours, unavailable = None, error
            say("waiting for the worker (stock XNNPACK lowering)")
            stock = pending.result()
    finally:
        _for_worker.clear()
    ok = float32.ok and float16.ok

    print(f"\n2. Lowering the {dtype_name(XNNPACK_DTYPE)} program for XNNPACK, stock and with edgefuse, and running "
          "both .pte in executorch.runtime\n")
    say("running both programs in executorch.runtime")
    expected = flat_tensors(eager16 if eager16 is not None else spec16.eager())
    run_and_check(stock, spec16.inputs, expected)
    if ours is not None:
        run_and_check(ours, spec16.inputs, expected, stock)
    print("\n".join(comparison_lines(stock, ours)))
    if unavailable is not None:
        print(f"  edgefuse: {unavailable}")
        return UNAVAILABLE
    ok &= stock.ok and ours.ok
    print(f"  delegates: {stock.summary.delegates} stock -> {ours.summary.delegates} edgefuse; ops outside: "
          f"{len(stock.summary.outside)} -> {len(ours.summary.outside)}")

    from edgefuse.compare.delegate_map import render

    try:
        write_text(destination, render([stock.summary, ours.summary], f"delegate map: {MODEL} ({dtype_name(XNNPACK_DTYPE)})"))
    except OSError as error:
        raise UsageError(f"cannot write the delegate map to {destination}: {error.strerror or error}") from error
    print(f"  delegate map (open it in a browser): {destination}")
    return OK if ok else CHECK_FAILED


def _build(dtype: torch.dtype) -> ModelSpec:
    from edgefuse.inputs.models import build_model

    try:
        module, inputs = build_model(MODEL, dtype=dtype, layers=LAYERS)
    except ImportError as error:
        raise UsageError(f"the demo needs transformers: pip install 'edgefuse[models]' ({error})") from error
    return ModelSpec(MODEL, "builtin", tuple(inputs), module=module)


def _qnn_report(spec: ModelSpec, program: ExportedProgram, say) -> tuple[Report, object]:
    """The QNN report of ``program`` at the capture stage, and the eager output it compared with (or None)."""
    eager = []
    hook = spec.module.register_forward_hook(lambda _module, _args, output: eager.append(output))
    try:
        report = build_report(spec, backend="qnn", stage="capture", progress=say, program=program)
    finally:
        hook.remove()
    return report, (eager[0] if len(eager) == 1 else None)


def _stock_lowering(start: float, enabled: bool) -> CheckedProgram:
    """The worker's half: the stock XNNPACK lowering of the float16 program, serialized."""
    say = Progress(enabled=enabled)
    say.start = start
    return lower_to_pte(_for_worker["program"], "stock", lambda what: say(f"(worker) {what}"))


if __name__ == "__main__":  # ``python -m edgefuse.cli.demo`` runs the demo as ``edgefuse demo`` does
    from edgefuse.cli import main

    raise SystemExit(main(["demo"]))
