"""What the recomposition decides on the tiny models, as plain data, to hold a faster pass to the same answers.

``python -m tests.core.decisions_record`` (with ``PYTHONPATH=src``) writes ``tests/core/data/decisions.json``: for
each model, dtype and check, the casts ``RemoveRedundantCasts`` removed, every field of every decision, the
metadata of each rebuilt node and a hash of what changed in the graph (nodes erased, nodes added).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import sys

import torch
from torch.export import export

import edgefuse
from edgefuse.inputs.models import build_model
from edgefuse.core.ops import Role, table_for
from edgefuse.core.passes import RecomposeRmsNorm, RemoveRedundantCasts

PATH = pathlib.Path(__file__).parent / "data" / "decisions.json"
MODELS = ("tiny-qwen3", "tiny-gemma3", "tiny-t5", "tiny-olmo2", "tiny-mamba2")
DTYPES = ("float32", "bfloat16")
#: (mode, backend, quantization_capture).
CAPTURE_QNN, CAPTURE_ATEN, EDGE_QNN = ("capture", "qnn", True), ("capture", "aten", False), ("edge", "qnn", False)
CHECKS = (CAPTURE_QNN, CAPTURE_ATEN, EDGE_QNN)
#: The (model, dtype) pairs checked and their checks: every model (each writes its norm its own way)
#: captured for QNN and for aten in float32; Qwen3 (QK-norms) and Gemma 3 (``1 + w``) in bfloat16 too;
#: one edge program, the slowest to build (``to_edge``), in float32. Few enough for the core tests to stay
#: quick, with every check and both dtypes covered.
PAIRS = {
    **{(model, "float32"): (CAPTURE_QNN, CAPTURE_ATEN) for model in MODELS},
    ("tiny-olmo2", "float32"): (CAPTURE_QNN, CAPTURE_ATEN, EDGE_QNN),
    ("tiny-qwen3", "bfloat16"): (CAPTURE_QNN, CAPTURE_ATEN),
    ("tiny-gemma3", "bfloat16"): (CAPTURE_QNN, CAPTURE_ATEN),
}


def _plain(value: object) -> object:
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _val(value: object) -> list | None:
    """What a rebuilt node's fake tensor says: shape, strides, dtype, device, requires_grad, offset."""
    if not isinstance(value, torch.Tensor):
        return None
    return [list(map(int, value.shape)), list(map(int, value.stride())), str(value.dtype), str(value.device),
            value.requires_grad, int(value.storage_offset())]


def rewrite(program, mode: str, backend: str, capture: bool) -> dict:
    """Both passes on a fresh copy of ``program`` in ``mode``, and what they did."""
    target = program.module() if mode == "capture" else program
    gm = target if mode == "capture" else target.graph_module
    before = {n.name for n in gm.graph.nodes}
    removal, recompose = RemoveRedundantCasts(), RecomposeRmsNorm(backend=backend, quantization_capture=capture)
    removal(target)
    recompose(target)
    table = table_for(gm.graph)
    return {
        "removed": removal.removed,
        "decisions": [{k: _plain(v) for k, v in dataclasses.asdict(d).items()} for d in recompose.decisions],
        "vals": [_val(n.meta.get("val")) for n in gm.graph.nodes if table.is_a(n, Role.RMS_NORM)],
        "graph": _change(before, gm),
    }


def _change(before: set[str], gm) -> str:
    """A hash of what the passes changed in the graph: the nodes they erased, and each node they added with
    its target and arguments. (Not of the whole code: export orders some nodes of Gemma 3's graph
    differently from one process to the next.)"""
    after = {n.name for n in gm.graph.nodes}
    added = [f"{n.name}={n.op}:{n.target}{n.args}{n.kwargs}" for n in gm.graph.nodes if n.name not in before]
    return hashlib.sha256(repr((sorted(before - after), added)).encode()).hexdigest()


def cases() -> list[tuple[str, str, tuple[str, str, bool]]]:
    """(model, dtype, check) of every recorded case (:data:`PAIRS`)."""
    return [(m, d, c) for (m, d), checks in PAIRS.items() for c in checks]


def key(model: str, dtype: str, check: tuple[str, str, bool]) -> str:
    mode, backend, capture = check
    return f"{model}/{dtype}/{mode}/{backend}" + ("+quantization-capture" if capture else "")


def record_model(model: str, dtype: str) -> dict[str, dict]:
    """Every check :data:`PAIRS` names for one model in one dtype."""
    module, inputs = build_model(model, getattr(torch, dtype))
    return record_program(model, dtype, export(module, inputs))


def record_program(model: str, dtype: str, program) -> dict[str, dict]:
    """Every check :data:`PAIRS` names for one model in one dtype, on ``program``, its export (each check
    rewrites a copy)."""
    out = {}
    edge = None
    for _, _, check in (case for case in cases() if case[:2] == (model, dtype)):
        if check[0] == "edge":
            from executorch.exir import to_edge

            edge = edge or to_edge(program, compile_config=edgefuse.edge_compile_config()).exported_program()
            out[key(model, dtype, check)] = rewrite(edge, *check)
        else:
            out[key(model, dtype, check)] = rewrite(program, *check)
    return out


if __name__ == "__main__":
    recorded = {}
    for model, dtype in PAIRS:
        recorded.update(record_model(model, dtype))
        print(model, dtype, file=sys.stderr)
    PATH.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
