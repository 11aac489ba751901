"""Standalone reproducer files: the failing module as source, and the one check that fails on it.

The module and its inputs are written out as plain Python (see :mod:`edgefuse.fuzz.render`), so a
reproducer rebuilds them with torch alone, without the generator; the check is spelled out below them and
uses edgefuse through its public names alone (the pass, :mod:`edgefuse.xnnpack`'s ``lower``, and the
fuzzer's tolerance and norm-by-norm helpers from :mod:`edgefuse.fuzz`, so that the file's verdict is the
fuzzer's). Running it prints what the pass decided and exits 1 while the bug is there, 0 once it is
fixed. ``SPEC`` at the bottom is the generator's description of the case, for
``python -m edgefuse.fuzz --replay FILE``.
"""

from __future__ import annotations

import itertools
import pprint
import re
import textwrap
from pathlib import Path
from typing import Sequence

from edgefuse.core._fx import dtype_name
from edgefuse.fuzz.check import Finding, check_name
from edgefuse.fuzz.render import describe, source
from edgefuse.fuzz.spec import CaseSpec, normalized_shape, to_dict
from edgefuse.fuzz.tolerance import eps_values

_CHECK = '''

# --- the check --------------------------------------------------------------------------------------

import copy
import sys
import traceback

import edgefuse
from edgefuse.fuzz import ULPS, compare_at, norm_by_norm, output_tolerance_dtypes
from executorch.exir import to_edge
from torch.export import export


def _outputs(program, inputs):
    with torch.no_grad():
        result = program(*copy.deepcopy(inputs))
    return list(result) if isinstance(result, (tuple, list)) else [result]


def main():
    module = MODULE().eval()
    inputs = INPUTS()
    eager = _outputs(module, inputs)
    program = export(module, inputs)
    if MODE == "capture":
        base = program
    else:
        config = edgefuse.edge_compile_config(_skip_dim_order=MODE == "edge-no-dim-order")
        base = to_edge(program, compile_config=config).exported_program()
    target = base.module() if MODE == "capture" else copy.deepcopy(base)
    failures = []
    try:
        result = edgefuse.recompose_rms_norm(target, backend=BACKEND, quantization_capture=QUANTIZATION_CAPTURE)
    except Exception:
        traceback.print_exc()
        print(f"FAIL: recompose_rms_norm raised ({MODE}, {BACKEND}, quantization_capture={QUANTIZATION_CAPTURE})")
        return 1
    for decision in result.decisions:
        print(f"{decision.module_path}: rebuilt={decision.rebuilt} reason={decision.reason!r} input={decision.input} "
              f"weight={decision.weight} eps={decision.eps} dtype={decision.dtype} shape={decision.normalized_shape}")
        path = (decision.module_path or "").rsplit(".", 1)[-1]
        if not decision.rebuilt:
            if not decision.reason:
                failures.append(f"{decision.mean} was left without a reason")
            continue
        if path == "norm" and NEAR_MISS:
            failures.append(f"the near miss {NEAR_MISS!r} was rebuilt as an rms_norm")
        if path in EXPECTED:
            shape, eps_values = EXPECTED[path]
            if tuple(decision.normalized_shape) != shape:
                failures.append(f"{path} rebuilt over {decision.normalized_shape}, the model normalizes {shape}")
            if decision.eps not in eps_values:
                failures.append(f"{path} rebuilt with eps {decision.eps!r}, the model adds one of {sorted(eps_values)}")
    rewritten = target if MODE == "capture" else target.module()
    try:
        actual = _outputs(rewritten, inputs)
    except Exception:
        traceback.print_exc()
        print("FAIL: the rewritten program no longer runs")
        return 1

    # Norm by norm: each rebuilt norm against the decomposed norm it replaced, computed from the same values.
    new = {d.node: d.mean for d in result.rebuilt if d.node}
    local = norm_by_norm(base.module(), rewritten, new, inputs)
    for norm in (local.norms.values() if local else ()):
        print(norm)
        if norm.twin is not None and not norm.ok:
            failures.append(f"the rebuilt {norm.node} differs from {norm.twin}, the decomposed norm it replaced")

    # Outputs against eager, at the coarsest dtype on a path from a rebuilt norm (else the output's own).
    tolerance = output_tolerance_dtypes(result.graph_module, set(new))
    unrewritten = _outputs(base.module(), inputs)
    for i, (expected, got) in enumerate(zip(eager, actual)):
        dtype = tolerance[i] or expected.dtype
        if got.dtype != expected.dtype:
            failures.append(f"output {i} is {got.dtype}, eager gives {expected.dtype}")
            continue
        comparison = compare_at(expected, got, dtype, ULPS)
        if comparison.ok:
            continue
        if not compare_at(expected, unrewritten[i], dtype, ULPS).ok:  # export itself computes differently
            comparison = compare_at(unrewritten[i], got, dtype, ULPS)
            if comparison.ok:
                continue
        why = local.explains(i, set(new)) if local else None
        if why:
            print(f"output {i}: {comparison}: magnified by the model, not a finding: {why}")
            continue
        failures.append(f"output {i} differs from eager: {comparison}, tolerance in {dtype}")
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print("OK: the check passes")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
'''


_XNNPACK_CHECK = '''

# --- the check: edgefuse's XNNPACK flow, run in executorch.runtime ----------------------------------

import copy
import sys

from edgefuse.fuzz import TOLERANCES, compare_at
from edgefuse.programs import detached
from edgefuse.xnnpack import lower
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime
from torch.export import export


def _outputs(program, inputs):
    with torch.no_grad():
        result = program(*copy.deepcopy(inputs))
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _run_pte(manager, inputs):
    """The tensor outputs of the lowered program ``manager``, serialized and run in executorch.runtime
    directly: a reproducer takes only edgefuse's public names, and edgefuse.runtime (its LoadedProgram)
    declares none."""
    method = Runtime.get().load_program(manager.to_executorch().buffer).load_method("forward")
    return [t for t in method.execute(list(copy.deepcopy(inputs))) if isinstance(t, torch.Tensor)]


def main():
    module = MODULE().eval()
    inputs = INPUTS()
    eager = _outputs(module, inputs)
    program = export(module, inputs)
    actual = _run_pte(lower(detached(program)), inputs)
    stock = _run_pte(to_edge_transform_and_lower(detached(program), partitioner=[XnnpackPartitioner()]), inputs)
    failures = []
    for i, (expected, got, theirs) in enumerate(zip(eager, actual, stock)):
        if got.dtype != expected.dtype or got.shape != expected.shape:
            failures.append(f"output {i} is {got.dtype} {list(got.shape)}, eager {expected.dtype} {list(expected.shape)}")
            continue
        ulps = TOLERANCES["lowered program"].ulps
        ours, reference = compare_at(expected, got, expected.dtype, ulps), compare_at(expected, theirs, expected.dtype, ulps)
        one_more = compare_at(expected, expected, expected.dtype, TOLERANCES["beside stock"].ulps).allowed
        print(f"output {i}: edgefuse off by {ours.max_error:.6g}, stock by {reference.max_error:.6g}, {ours.allowed:.6g} allowed")
        if not ours.ok and ours.max_error > reference.max_error + one_more:
            failures.append(f"output {i}: edgefuse's .pte is off eager by {ours.max_error:.6g}")
    if len(actual) != len(eager):
        failures.append(f"the .pte returns {len(actual)} tensors, eager {len(eager)}")
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print("OK: the check passes")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
'''


_HOSTILE_CHECK = '''

# --- the check: the pass on a damaged graph ---------------------------------------------------------

import copy
import sys
import traceback

import edgefuse
from edgefuse.fuzz import ULPS, compare_at
from torch.export import Dim, export
{damage_source}

def _outputs(program, inputs):
    with torch.no_grad():
        result = program(*copy.deepcopy(inputs))
    return list(result) if isinstance(result, (tuple, list)) else [result]


def main():
    module = MODULE().eval()
    inputs = INPUTS()
    eager = _outputs(module, inputs)
    dynamic = [a for a in DAMAGE if a[0] == "dynamic"]
    if dynamic:
        shapes = [{{dynamic[0][1]: Dim("d", min=2, max=64)}}] + [None] * (len(inputs) - 1)
        program = export(module, inputs, dynamic_shapes=tuple(shapes))
    else:
        program = export(module, inputs)
    if VARIANT == "aten-program":
        target = program
    else:
        target = apply_damage(program.module(), [a for a in DAMAGE if a[0] != "dynamic"])
        if VARIANT == "second-pass":
            edgefuse.recompose_rms_norm(target)
        elif VARIANT == "after-cast-removal":
            edgefuse.remove_redundant_casts(target)
    try:
        result = edgefuse.recompose_rms_norm(target, backend=BACKEND, quantization_capture=QUANTIZATION_CAPTURE)
    except Exception:
        traceback.print_exc()
        print(f"FAIL: recompose_rms_norm raised on the {{VARIANT}} graph ({{BACKEND}}, quantization_capture={{QUANTIZATION_CAPTURE}})")
        return 1
    for decision in result.decisions:
        print(f"{{decision.module_path}}: rebuilt={{decision.rebuilt}} reason={{decision.reason!r}}")
    if not MUST_MATCH:
        print("OK: the pass returned (outputs are not compared on a graph whose metadata lies)")
        return 0
    actual = _outputs(target.module() if VARIANT == "aten-program" else target, inputs)
    failures = []
    for i, (expected, got) in enumerate(zip(eager, actual)):
        dtype = TOLERANCE_DTYPES[i] if i < len(TOLERANCE_DTYPES) and TOLERANCE_DTYPES[i] else expected.dtype
        if not compare_at(expected, got, dtype, ULPS).ok:
            failures.append(f"output {{i}} differs from eager (tolerance in {{dtype}})")
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print("OK: the check passes")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def reproducer_text(finding: Finding, specs: Sequence[CaseSpec] | None = None, note: str = "") -> str:
    """The text of a reproducer file for ``finding`` (on ``specs`` side by side when given)."""
    specs = list(specs or finding.batch or (finding.spec,))
    mode, backend, capture = finding.check
    spec = finding.spec
    # The detail is an error's text: kept inside the docstring whatever quotes or backslashes it holds.
    detail = finding.detail.replace("\n", " ").replace("\\", "\\\\").replace('"""', '\\"""')
    detail = textwrap.indent(textwrap.shorten(detail, 1500), "    ")
    cases = "\n".join(f"    {describe(s)}" for s in specs)
    doc = [
        f'"""edgefuse fuzz reproducer: {finding.kind} under {check_name(finding.check)}.',
        "",
        "Case(s):",
        cases,
        "",
        "What the fuzzer saw:",
        detail,
        "",
        f"Found by: python -m edgefuse.fuzz --seed {spec.seed} --start {spec.index} --cases 1" + (f"; {note}" if note else ""),
        "Run this file: it exits 1 while the bug is there and 0 once it is fixed.",
        '"""',
        "",
    ]
    lines = [*doc, source(specs), ""]
    if len(specs) == 1:
        lines += ["MODULE = C0_Case", "INPUTS = C0_inputs"]
    else:
        lines += ["MODULE = Batch", "INPUTS = lambda: " + " + ".join(f"C{k}_inputs()" for k in range(len(specs)))]
    spec_lines = [
        "",
        "# The generator's description of the case(s), for `python -m edgefuse.fuzz --replay THIS_FILE`.",
        "SPEC = " + pprint.pformat(_printable([to_dict(s) for s in specs]), width=110, sort_dicts=False),
    ]
    if finding.kind.startswith("hostile"):
        from edgefuse.fuzz.hostile import DAMAGE_SOURCE, MUST_MATCH

        lines.append(f"VARIANT, BACKEND, QUANTIZATION_CAPTURE = {mode!r}, {backend!r}, {capture!r}")
        lines.append(f"DAMAGE = {list(finding.damage)!r}")
        lines.append(f"MUST_MATCH = {MUST_MATCH.get(mode, True)!r}")
        lines.append(f"TOLERANCE_DTYPES = [{', '.join(_dtype_literal(d) for d in finding.tolerance)}]")
        return "\n".join(lines + spec_lines) + _HOSTILE_CHECK.format(damage_source=DAMAGE_SOURCE)
    if finding.kind.startswith("xnnpack"):
        return "\n".join(lines + spec_lines) + _XNNPACK_CHECK
    expected = {}
    if len(specs) == 1:
        for name, norm, shape in (("norm", spec.norm, spec.norm_shape), ("feed", spec.feed, spec.shape)):
            if norm is not None and not (name == "norm" and spec.near_miss):
                expected[name] = (normalized_shape(norm, shape), eps_values(norm, spec.dtype))
    lines.append(f"MODE, BACKEND, QUANTIZATION_CAPTURE = {mode!r}, {backend!r}, {capture!r}")
    lines.append(f"NEAR_MISS = {spec.near_miss!r}" if len(specs) == 1 else "NEAR_MISS = None")
    lines.append(f"EXPECTED = {_literal(expected)}")
    return "\n".join(lines + spec_lines) + _CHECK


class _Float:
    """A non-finite float that prints as source code."""

    def __init__(self, value: float):
        self.value = value

    def __repr__(self) -> str:
        return _float(self.value)


def _printable(data):
    if isinstance(data, float) and (data != data or data in (float("inf"), float("-inf"))):
        return _Float(data)
    if isinstance(data, dict):
        return {k: _printable(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_printable(v) for v in data)
    return data


def _literal(expected: dict) -> str:
    parts = []
    for name, (shape, values) in expected.items():
        vals = ", ".join(_float(v) for v in sorted(values, key=lambda v: (v != v, v)))
        parts.append(f"{name!r}: ({tuple(shape)!r}, {{{vals}}})")
    return "{" + ", ".join(parts) + "}"


def _float(v: float) -> str:
    if v != v:
        return "float('nan')"
    if v in (float("inf"), float("-inf")):
        return f"float('{v}')"
    return repr(v)


def _dtype_literal(dtype) -> str:
    return "None" if dtype is None else f"torch.{dtype_name(dtype)}"


def file_name(finding: Finding, suffix: str = "") -> str:
    mode, backend, capture = finding.check
    check = f"{mode}-{backend}{'-qc' if capture else ''}"
    name = f"{finding.kind}-{finding.spec.name}-{check}{suffix}.py"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def write(directory: Path, finding: Finding, text: str, suffix: str = "") -> Path:
    """Write a reproducer into ``directory``, a folder of this user's that no other user can write (made
    when missing), never through a symlink and never over a file this run did not write
    (:func:`edgefuse.runtime.files.write_text`): a name an earlier run took gets ``-2``, ``-3``, ... before
    ``.py``. Raises ``OSError`` otherwise."""
    from edgefuse.runtime.files import own_folder, write_text

    own_folder(directory)
    for number in itertools.count(1):
        path = directory / file_name(finding, suffix + (f"-{number}" if number > 1 else ""))
        try:
            write_text(path, text)
        except FileExistsError:
            continue
        return path


#: The most a reproducer may hold: the fuzzer writes at most ``validate.MAX_CASES`` cases to a file,
#: about 190 kB at that count.
MAX_BYTES = 1 << 20


def read_specs(path: Path) -> list[CaseSpec]:
    """The specs a reproducer file holds in ``SPEC``: parsed, never executed, and every field checked
    against what the generator can write (:mod:`edgefuse.fuzz.validate`) before anything renders it.

    Raises ``ValueError`` (a :class:`~edgefuse.fuzz.validate.SpecError` names the field) for a file that is
    not a regular file of at most :data:`MAX_BYTES` (:func:`edgefuse.runtime.files.read_regular`: a FIFO or
    a device is refused before anything waits on it), not Python, holds no ``SPEC``, or a ``SPEC`` the
    fuzzer did not write; ``OSError`` when it cannot be read.
    """
    import ast

    from edgefuse.fuzz.validate import SpecError, cases
    from edgefuse.runtime.files import read_regular

    text = read_regular(path, MAX_BYTES, "a fuzz reproducer")
    try:
        tree = ast.parse(text)
    except (SyntaxError, RecursionError, MemoryError) as error:
        raise ValueError(f"it is not Python ({type(error).__name__})") from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SPEC" for t in node.targets):
            try:
                literal = _eval_literal(node.value)
            except (TypeError, ValueError, SyntaxError, RecursionError, MemoryError) as error:
                raise ValueError(f"its SPEC is not a literal ({type(error).__name__})") from None
            try:
                return cases(literal)
            except SpecError as error:
                raise ValueError(f"its SPEC is not a list of cases the fuzzer wrote: {error}") from None
    raise ValueError("it holds no SPEC")


def _eval_literal(node):
    """``ast.literal_eval`` that also takes ``float('nan')`` and ``float('inf')``."""
    import ast

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float" and len(node.args) == 1:
        return float(ast.literal_eval(node.args[0]))
    if isinstance(node, ast.Dict):
        return {_eval_literal(k): _eval_literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return tuple(_eval_literal(e) for e in node.elts)
    return ast.literal_eval(node)
