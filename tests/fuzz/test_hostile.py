"""Hostile variants of generated cases (metadata stripped, symbolic dims, non-finite eps, an unknown op)
get reasons from the pass and keep their outputs, and the hostile check can fail."""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter

import pytest
import torch
from torch.export import Dim, export

import edgefuse
from edgefuse.fuzz.hostile import run_hostile
from edgefuse.fuzz.edge_programs import to_edge_program
from edgefuse.fuzz.render import build
from edgefuse.fuzz.spec import CaseSpec
from edgefuse.core.verify import compare
from tests.harness import rms_norm_nodes
from tests.fuzz.cases import LLAMA, first_case


@pytest.mark.parametrize("mode", ["capture", "edge"])
def test_graphs_without_tensor_metadata_leave_every_norm_with_a_reason(mode):
    specs = [first_case(lambda s: s.near_miss is None and s.norm.form == form) for form in ("llama", "gemma", "t5", "functional")]
    built = build(specs)
    program = export(built.module, built.inputs)
    target = program.module() if mode == "capture" else to_edge_program(program, mode)
    graph = target.graph if mode == "capture" else target.graph_module.graph
    for node in graph.nodes:
        node.meta.pop("val", None)
    for backend in ("aten", "qnn"):
        result = edgefuse.recompose_rms_norm(copy.deepcopy(target), backend=backend)
        assert result.decisions and all(not d.rebuilt and "meta['val']" in d.reason for d in result.decisions)


def test_a_symbolic_width_gets_a_reason_and_symbolic_rows_still_match():
    spec = dataclasses.replace(LLAMA, shape=(3, 5, 16), dtype="float16", norm=dataclasses.replace(LLAMA.norm, weight=None))
    built = build([spec])
    wide = export(built.module, built.inputs, dynamic_shapes=({2: Dim("width", min=2, max=64)},))
    result = edgefuse.recompose_rms_norm(wide.module())
    assert result.decisions and all(not d.rebuilt and "symbolic" in d.reason for d in result.decisions)
    rows = export(built.module, built.inputs, dynamic_shapes=({0: Dim("rows", min=2, max=64)},)).module()
    assert [d.rebuilt for d in edgefuse.recompose_rms_norm(rows).decisions] == [True]
    for n in (2, 7, 64):
        x = torch.randn(n, 5, 16, generator=torch.Generator().manual_seed(n)).to(torch.float16)
        assert compare(built.module(x)[0], rows(x)[0]).ok


@pytest.mark.parametrize("mode", ["capture", "edge-no-dim-order"])
def test_nan_and_inf_eps_are_left_with_a_reason(mode):
    specs = [
        CaseSpec(seed=0, index=i, shape=(2, 8), dtype=dtype, near_miss="bad-eps",
                 norm=dataclasses.replace(LLAMA.norm, eps=eps, eps_how=how, eps_dtype="float32"))
        for i, (eps, how, dtype) in enumerate(
            [(float("nan"), "right", "float32"), (float("inf"), "left", "float16"), (float("-inf"), "right", "bfloat16"),
             (float("nan"), "const", "float16"), (float("inf"), "const", "float32")]
        )
    ]
    built = build(specs)
    program = export(built.module, built.inputs)
    target = program.module() if mode == "capture" else to_edge_program(program, mode)
    for backend in ("aten", "qnn"):
        result = edgefuse.recompose_rms_norm(copy.deepcopy(target), backend=backend)
        assert len(result.decisions) == len(specs)
        assert all(not d.rebuilt and "finite" in d.reason for d in result.decisions), result.decisions


def test_hostile_variants_of_generated_cases_get_reasons_and_keep_outputs():
    specs = [first_case(lambda s: s.near_miss is None and s.norm.form == "gemma" and s.shape[0] > 1)]
    specs.append(first_case(lambda s: s.near_miss is not None and s.feed is not None))
    variants: Counter = Counter()
    for spec in specs:
        result = run_hostile(spec)
        variants.update(result.variants)
        assert not result.findings, [f"{f.kind} {f.check}: {f.detail[-500:]}" for f in result.findings]
    for name in ("aten-program", "strip-meta-all", "strip-meta-some", "garbage-meta", "unknown-op", "second-pass",
                 "after-cast-removal", "symbolic-lead"):
        assert variants[name] >= 3, variants


def test_the_hostile_check_reports_an_exception_and_a_mismatch(monkeypatch):
    real = edgefuse.recompose_rms_norm
    calls = []

    def flaky(target, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        result = real(target, **kwargs)
        for node in rms_norm_nodes(result.graph_module):
            node.args = (node.args[0], node.args[1], node.args[2], 0.5)  # another eps
        result.graph_module.recompile()
        return result

    monkeypatch.setattr(edgefuse, "recompose_rms_norm", flaky)
    result = run_hostile(LLAMA)
    kinds = Counter(f.kind for f in result.findings)
    assert kinds["hostile-exception"] == 1 and kinds["hostile-mismatch"] >= 1, kinds


def test_an_unknown_op_between_cast_and_norm_is_never_walked_past():
    half = dataclasses.replace(LLAMA.norm, weight=dataclasses.replace(LLAMA.norm.weight, dtype="float16"))
    built = build([dataclasses.replace(LLAMA, dtype="float16", norm=half)])
    gm = export(built.module, built.inputs).module()
    upcast = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.to.dtype)
    with gm.graph.inserting_after(upcast):
        opaque = gm.graph.call_function(torch.ops.edgefuse_fuzz.opaque.default, (upcast,))
    opaque.meta["val"] = upcast.meta["val"]
    upcast.replace_all_uses_with(opaque, delete_user_cb=lambda user: user is not opaque)
    gm.recompile()
    [decision] = edgefuse.recompose_rms_norm(gm).decisions
    # The norm reads the opaque op's float32 output and casts back to float16: no float16 tensor holds it.
    assert not decision.rebuilt and rms_norm_nodes(gm) == []

