"""Time edgefuse's recomposition beside ExecuTorch 1.5.1's QNN passes on tiny Qwen3 capture graphs.

``python -m edgefuse.tools.pass_time [--layers 28 56] [--runs 3] [--tokens 12]``

For each layer count, a Qwen3 built from a ``Qwen3Config`` with random weights (hidden 64, 4 heads, 2 KV
heads, head dim 16, vocabulary 256; nothing is downloaded) is exported once with ``torch.export``; each
run then rewrites a fresh ``ExportedProgram.module()`` both ways, the two sides alternating after a
warm-up run of each (the one timer, :mod:`edgefuse.runtime.timer`):

- stock: ``RemoveRedundancy(quantization_capture=True)`` then ``RecomposeRmsNorm(quantization_capture=True)``
  from ``executorch.backends.qualcomm._passes``, as QNN's annotation pipeline instantiates them;
- edgefuse: ``RemoveRedundantCasts()`` then ``RecomposeRmsNorm(backend="qnn", quantization_capture=True)``.

It prints, per layer count, the graph's nodes, the norms each side rebuilt (and edgefuse's candidates),
the median over the runs of each side's process CPU time and wall time in milliseconds, their ratio
(edgefuse over stock; below 1 is faster), and the growth from the smallest layer count to the largest.
CPU time is the headline: it does not count the time a shared machine runs other work. Garbage
collection is off while timing. This is a measurement, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torch.fx import GraphModule

EXIT_OK, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 2, 3


@dataclass
class PassTime:
    """The median of the runs of one side on one graph, and what that side produced."""

    cpu_ms: float
    wall_ms: float
    rebuilt: int
    candidates: int | None = None


def capture_graph(layers: int, tokens: int):
    """The exported program of a tiny Qwen3 with ``layers`` layers reading ``tokens`` token ids."""
    from torch.export import export

    from edgefuse.inputs.models import build_model

    module, inputs = build_model("tiny-qwen3", layers=layers, seq_len=tokens, vocab_size=256)
    return export(module, inputs)


def _edgefuse(gm: GraphModule) -> tuple[int, int]:
    from edgefuse.core.passes import RecomposeRmsNorm, RemoveRedundantCasts

    recompose = RecomposeRmsNorm(backend="qnn", quantization_capture=True)
    RemoveRedundantCasts()(gm)
    recompose(gm)
    return sum(d.rebuilt for d in recompose.decisions), len(recompose.decisions)


def _stock(gm: GraphModule) -> tuple[int, None]:
    import torch
    from executorch.backends.qualcomm._passes.recompose_rms_norm import RecomposeRmsNorm
    from executorch.backends.qualcomm._passes.remove_redundancy import RemoveRedundancy

    RemoveRedundancy(quantization_capture=True)(gm)
    RecomposeRmsNorm(quantization_capture=True)(gm)
    rms_norm = torch.ops.aten.rms_norm.default
    return sum(n.op == "call_function" and n.target is rms_norm for n in gm.graph.nodes), None


def measure(program, runs: int, warmup: int = 1) -> dict[str, PassTime]:
    """The median CPU and wall time of each side over ``runs`` runs after ``warmup`` others, with the one
    timer (:func:`edgefuse.runtime.timer.alternate`: the sides alternating), each run on a fresh module
    whose making is not timed."""
    from edgefuse.runtime.timer import Task, alternate

    produced: dict[str, tuple[int, int | None]] = {}

    def side(name: str, run: Callable[[GraphModule], tuple[int, int | None]]) -> Task:
        def rewrite(mark) -> None:
            gm = program.module()
            mark("module")
            produced[name] = run(gm)
            mark("passes")

        return Task(name, rewrite)

    sides = {"stock": _stock, "edgefuse": _edgefuse}
    samples = alternate([side(name, run) for name, run in sides.items()], runs, warmup)
    return {name: PassTime(s.median("passes", cpu=True) / 1e3, s.median("passes") / 1e3, *produced[name])
            for name, s in zip(sides, samples)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m edgefuse.tools.pass_time", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--layers", type=int, nargs="+", default=[28, 56], help="layer counts (default 28 56)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per side and graph; the median counts (default 3)")
    parser.add_argument("--tokens", type=int, default=12, help="token ids the model reads (default 12)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.runs < 1 or args.tokens < 1 or any(n < 1 for n in args.layers):
        print("pass_time: --runs, --tokens and --layers take positive numbers", file=sys.stderr)
        return EXIT_USAGE
    try:  # imported before timing, so that no run pays for an import
        import executorch.backends.qualcomm._passes.recompose_rms_norm  # noqa: F401
        import executorch.backends.qualcomm._passes.remove_redundancy  # noqa: F401
        import transformers  # noqa: F401

        import edgefuse.core.passes  # noqa: F401
    except ImportError as error:
        print(f"pass_time: needs executorch's QNN passes and transformers: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE

    from edgefuse.runtime.timer import conditions

    header = (f"{'layers':>6} {'nodes':>6} {'norms':>13} {'stock cpu':>9} {'edgefuse cpu':>12} {'ratio':>6}"
              f" {'stock wall':>10} {'edgefuse wall':>13} {'ratio':>6}")
    print(header)
    rows = {}
    for layers in args.layers:
        program = capture_graph(layers, args.tokens)
        nodes = len(program.module().graph.nodes)
        best = measure(program, args.runs)
        stock, ours = best["stock"], best["edgefuse"]
        rows[layers] = best
        norms = f"{ours.rebuilt}/{ours.candidates} ({stock.rebuilt})"
        print(f"{layers:>6} {nodes:>6} {norms:>13} {stock.cpu_ms:>9.1f} {ours.cpu_ms:>12.1f} "
              f"{ours.cpu_ms / stock.cpu_ms:>6.2f} {stock.wall_ms:>10.1f} {ours.wall_ms:>13.1f} "
              f"{ours.wall_ms / stock.wall_ms:>6.2f}", flush=True)
    print("norms: rebuilt by edgefuse / its candidates (rebuilt by stock); times: ms, median of "
          f"{args.runs} runs after a warm-up run; ratio: edgefuse / stock")
    import torch

    print(conditions(torch.get_num_threads(), runtime=False))
    if len(rows) > 1:
        low, high = min(rows), max(rows)
        for side in ("edgefuse", "stock"):
            cpu = rows[high][side].cpu_ms / rows[low][side].cpu_ms
            wall = rows[high][side].wall_ms / rows[low][side].wall_ms
            print(f"growth from {low} to {high} layers, {side}: {cpu:.2f}x cpu, {wall:.2f}x wall")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
