"""Malformed and hostile input: damaged graphs must get a reason from the pass, never a traceback.

:func:`run_hostile` takes a generated case and feeds the pass graphs built from it that no exporter
makes on its own, then checks that ``recompose_rms_norm`` returns, and, where the graph still means
what the model computes, that the rewritten graph still runs and matches eager, at the outputs and norm by
norm (:mod:`edgefuse.fuzz.localize`):

* ``aten-program``: the ``ExportedProgram`` torch.export returns, passed as it is (lifted parameters);
* ``strip-meta-all`` / ``strip-meta-some``: ``meta["val"]`` removed from every node / from a random
  third of them (the pass reads dtypes and shapes from it);
* ``garbage-meta``: ``meta["val"]`` of random nodes replaced by a non-tensor, a tensor of another shape,
  or a list (only "no exception" is checked: a graph that lies about itself may be rewritten wrongly);
* ``unknown-op``: an op edgefuse does not know (an opaque copy) inserted after a random node;
* ``symbolic-lead`` / ``symbolic-width``: exported with a dynamic leading dim / last dim;
* ``second-pass``: a graph the pass already rewrote (for the aten profile), rewritten again;
* ``after-cast-removal``: a graph ``remove_redundant_casts`` already cleaned (that pass must keep the
  outputs too).

The fixed malformed graphs (empty graphs, NaN and inf eps, a weight of the wrong shape, ...) are in
:mod:`edgefuse.fuzz.malformed`.
"""

from __future__ import annotations

import copy
import random
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn
from torch.export import Dim, export
from torch.fx import GraphModule

import edgefuse
from edgefuse.fuzz.check import Finding
from edgefuse.fuzz.localize import norm_by_norm
from edgefuse.fuzz.render import build
from edgefuse.fuzz.spec import CaseSpec
from edgefuse.fuzz.tolerance import ULPS, compare_at, output_tolerance_dtypes
from edgefuse.core.ops import Role, table_for
from edgefuse.core.verify import outputs

#: the check name hostile findings carry: (variant, backend, quantization capture)
BACKENDS = (("aten", False), ("qnn", False), ("qnn", True))


@dataclass
class HostileResult:
    spec: CaseSpec
    variants: Counter = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)


#: The damage the variants do, as source: the fuzzer executes it, and reproducer files hold the same text.
DAMAGE_SOURCE = '''
def define_opaque_op():
    """An op edgefuse does not know: a copy, ``edgefuse_fuzz::opaque``."""
    try:
        return torch.ops.edgefuse_fuzz.opaque.default
    except (AttributeError, RuntimeError):
        pass
    library = torch.library.Library("edgefuse_fuzz", "DEF")
    library.define("opaque(Tensor x) -> Tensor")
    library.impl("opaque", lambda x: x.clone(), "CompositeExplicitAutograd")
    library.impl("opaque", lambda x: torch.empty_like(x), "Meta")
    define_opaque_op.library = library  # keep the registration alive
    return torch.ops.edgefuse_fuzz.opaque.default


def apply_damage(gm, actions):
    """Damage a captured graph by node name: ("strip", node), ("garbage", node, how), ("opaque-after", node)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    for action in actions:
        kind, node = action[0], nodes[action[1]]
        if kind == "strip":
            node.meta.pop("val", None)
        elif kind == "garbage":
            value, how = node.meta["val"], action[2]
            if how == "none":
                node.meta["val"] = None
            elif how == "int":
                node.meta["val"] = 3
            elif how == "list":
                node.meta["val"] = [value, value]
            elif how == "extra-dim":
                node.meta["val"] = value.new_empty((*value.shape, 2)) if value.dim() < 6 else None
            else:  # "other-dtype"
                node.meta["val"] = value.to(torch.float16 if value.dtype != torch.float16 else torch.float32)
        elif kind == "opaque-after":
            with gm.graph.inserting_after(node):
                opaque = gm.graph.call_function(define_opaque_op(), (node,))
            opaque.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(opaque, delete_user_cb=lambda user: user is not opaque)
            gm.recompile()
    return gm
'''
exec(compile(DAMAGE_SOURCE, "<edgefuse-fuzz-damage>", "exec"), globals())
define_opaque_op()

_GARBAGE = ("none", "int", "list", "extra-dim", "other-dtype")

#: Whether a variant's rewritten graph must still match eager (a graph whose metadata lies need not).
MUST_MATCH = {"garbage-meta": False}


def _plan_strip(gm: GraphModule, rng: random.Random, fraction: float) -> list:
    return [("strip", node.name) for node in gm.graph.nodes if rng.random() < fraction]


def _plan_garbage(gm: GraphModule, rng: random.Random) -> list:
    nodes = [n for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    return [("garbage", node.name, _GARBAGE[rng.randrange(5)]) for node in (rng.sample(nodes, k=max(1, len(nodes) // 3)) if nodes else [])]


def _plan_unknown_op(gm: GraphModule, rng: random.Random) -> list:
    candidates = [
        n for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_floating_point()
    ]
    return [("opaque-after", rng.choice(candidates).name)] if candidates else []


def _damaged(program, plan: Callable[[GraphModule], list]) -> tuple[GraphModule, tuple]:
    gm = program.module()
    actions = tuple(plan(gm))
    return apply_damage(gm, actions), actions


def _variants(spec: CaseSpec, module: nn.Module, inputs: tuple, rng: random.Random) -> Iterator[tuple[str, Callable, bool]]:
    """(name, a function making (a fresh target, the damage done), whether outputs must still match eager)."""
    program = export(module, inputs)
    yield "aten-program", lambda: (copy.deepcopy(program), ()), True
    yield "strip-meta-all", lambda: _damaged(program, lambda gm: _plan_strip(gm, rng, 1.0)), True
    yield "strip-meta-some", lambda: _damaged(program, lambda gm: _plan_strip(gm, rng, 0.33)), True
    yield "garbage-meta", lambda: _damaged(program, lambda gm: _plan_garbage(gm, rng)), MUST_MATCH["garbage-meta"]
    yield "unknown-op", lambda: _damaged(program, lambda gm: _plan_unknown_op(gm, rng)), True
    yield "second-pass", lambda: (_with(program.module(), lambda gm: edgefuse.recompose_rms_norm(gm)), ()), True
    yield "after-cast-removal", lambda: (_with(program.module(), edgefuse.remove_redundant_casts), ()), True
    x = inputs[0]
    for name, dim in (("symbolic-lead", 0), ("symbolic-width", x.dim() - 1)):
        if x.shape[dim] < 2:
            continue
        shapes = [{dim: Dim(f"d{dim}", min=2, max=64)}] + [None] * (len(inputs) - 1)
        try:
            dynamic = export(module, inputs, dynamic_shapes=tuple(shapes))
        except Exception:  # noqa: BLE001  (the generated module pins this size: not applicable)
            continue
        yield name, (lambda dynamic=dynamic, dim=dim: (dynamic.module(), (("dynamic", dim),))), True


def _with(gm: GraphModule, damage: Callable[[GraphModule], object]) -> GraphModule:
    damage(gm)
    return gm


def run_hostile(spec: CaseSpec, seed: int | None = None) -> HostileResult:
    """Feed the pass damaged graphs of ``spec``'s module; record escaped exceptions and mismatches."""
    result = HostileResult(spec)
    rng = random.Random(f"edgefuse-hostile:{spec.seed}:{spec.index}:{seed}")
    try:
        built = build([spec])
        eager = outputs(built.module, built.inputs)
        variants = list(_variants(spec, built.module, built.inputs, rng))
        clean = _dtypes_by_name(export(built.module, built.inputs).module())  # before any damage
    except Exception:  # noqa: BLE001  (unexportable: counted by the main check)
        return result
    for name, make, must_match in variants:
        for backend, capture in BACKENDS:
            target, damage = make()
            result.variants[name] += 1
            for kind, detail, tolerance in _check_variant(target, backend, capture, must_match, built.inputs, eager, clean):
                result.findings.append(Finding(kind, (name, backend, capture), detail, spec, tolerance=tolerance, damage=damage))
    return result


def _program_module(target) -> GraphModule:
    return target.module() if hasattr(target, "graph_signature") else target


def _check_variant(target, backend: str, capture: bool, must_match: bool, inputs, eager, clean) -> Iterator[tuple]:
    """(kind, detail, tolerance dtypes) for each broken property of one damaged graph under one profile."""
    try:
        original = copy.deepcopy(target) if must_match else None
    except Exception:  # noqa: BLE001  (metadata deepcopy cannot copy: no norm-by-norm comparison)
        original = None
    try:
        rewritten = edgefuse.recompose_rms_norm(target, backend=backend, quantization_capture=capture)
    except Exception:  # noqa: BLE001
        yield "hostile-exception", "recompose_rms_norm raised:\n" + traceback.format_exc(limit=-6), ()
        return
    for decision in rewritten.decisions:
        if not decision.rebuilt and not (isinstance(decision.reason, str) and decision.reason.strip()):
            yield "hostile-no-reason", f"a norm was left without a reason: {decision}", ()
    if not must_match:
        return
    try:
        actual = outputs(_program_module(target), inputs)
    except Exception:  # noqa: BLE001
        yield "hostile-mismatch", "the rewritten program no longer runs:\n" + traceback.format_exc(limit=-4), ()
        return
    # Every rms_norm in the graph (one from an earlier pass too) may have moved a rounding.
    gm = rewritten.graph_module
    table = table_for(gm.graph)
    norms = {n.name for n in gm.graph.nodes if table.is_a(n, Role.RMS_NORM)}
    tolerance = tuple(_tolerance(gm, norms, clean, rewritten))
    new = {d.node: d.mean for d in rewritten.rebuilt if d.node}
    local = norm_by_norm(_program_module(original), _program_module(target), new, inputs) if original is not None else None
    for norm in (local.norms.values() if local is not None else ()):
        if norm.twin is not None and not norm.ok:
            yield "hostile-mismatch", f"the rebuilt {norm.node} differs from {norm.twin}, the norm it replaced: {norm}", tolerance
    for i, (expected, got) in enumerate(zip(eager, actual)):
        dtype = tolerance[i] if i < len(tolerance) and tolerance[i] is not None else expected.dtype
        comparison = compare_at(expected, got, dtype, ULPS)
        if comparison.ok or (local is not None and local.explains(i, set(new))):
            continue
        rebuilt = "; ".join(f"{d.module_path} in {d.dtype} on {d.input}" for d in rewritten.rebuilt)
        yield "hostile-mismatch", f"output {i}: {comparison}; rebuilt: {rebuilt}", tolerance


def _dtypes_by_name(target) -> dict[str, torch.dtype]:
    gm = target.graph_module if hasattr(target, "graph_signature") else target
    out = {}
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            out[node.name] = value.dtype
    return out


def _tolerance(gm: GraphModule, new: set[str], clean: dict, rewritten) -> list:
    """Tolerance dtypes per output, along the paths from rebuilt norms, reading the dtypes of nodes
    whose metadata was stripped from the undamaged export (same node names)."""
    known = dict(clean)
    known.update({d.node: d.dtype for d in rewritten.rebuilt if d.node and d.dtype})
    return output_tolerance_dtypes(gm, new, known)
