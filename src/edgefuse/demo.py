"""The demo: export a tiny Qwen3 built from an embedded config, rebuild its norms and say what happened."""

from __future__ import annotations

import sys
import time

import torch
from torch.export import export

from executorch.exir import to_edge

from edgefuse.edge import edge_compile_config
from edgefuse.models import build_model
from edgefuse.recompose import RecomposeResult, recompose_rms_norm
from edgefuse.verify import compare_programs


def _table(result: RecomposeResult) -> str:
    rows = [("module", "dtype", "rebuilt", "input", "weight", "reason")]
    for d in result.decisions:
        dtype = str(d.dtype).removeprefix("torch.") if d.dtype else "-"
        rows.append((d.module_path or d.mean, dtype, "yes" if d.rebuilt else "no", d.input or "-", d.weight or "-", d.reason))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def _run(dtype: torch.dtype, stage: str, backend: str, out=sys.stdout) -> bool:
    model, inputs = build_model("tiny-qwen3", dtype=dtype)
    program = export(model, inputs)
    if stage == "capture":
        reference = program.module()
        rewritten = program.module()
        result = recompose_rms_norm(rewritten, backend=backend, quantization_capture=True)
    else:
        reference = to_edge(program, compile_config=edge_compile_config()).exported_program().module()
        edge_program = to_edge(program, compile_config=edge_compile_config()).exported_program()
        result = recompose_rms_norm(edge_program, backend=backend)
        rewritten = edge_program.module()
    comparisons = compare_programs(reference, rewritten, inputs, ulps=64)
    name = str(dtype).removeprefix("torch.")
    print(f"\ntiny-qwen3, {name}, {stage} graph, backend {backend}: "
          f"{len(result.rebuilt)} of {len(result.decisions)} norms rebuilt", file=out)
    print(_table(result), file=out)
    worst = max(c.max_error for c in comparisons)
    ok = all(c.ok for c in comparisons)
    print(f"max error against the unrewritten program: {worst:.3g} ({'within' if ok else 'OUTSIDE'} the "
          f"{name} tolerance)", file=out)
    return ok


def main() -> int:
    start = time.monotonic()
    ok = True
    for dtype, stage, backend in (
        (torch.float32, "edge", "qnn"),
        (torch.float16, "edge", "qnn"),
        (torch.bfloat16, "edge", "qnn"),
        (torch.bfloat16, "capture", "qnn"),
    ):
        ok &= _run(dtype, stage, backend)
    print(f"\ndone in {time.monotonic() - start:.1f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
