"""edgefuse fuzz reproducer: mismatch under capture/aten.

Case(s):
    case s0-c0: llama norm; float32 [3, 1, 2, 1]; channels-last

What the fuzzer saw:
    (a case)

Found by: python -m edgefuse.fuzz --seed 0 --start 0 --cases 1
Run this file: it exits 1 while the bug is there and 0 once it is fixed.
"""

import math

import torch
from torch import nn


def _rand(shape, seed, scale=1.0, around=0.0, dtype=torch.float32):
    """Seeded normal draws, ``around + scale * randn``, rounded to ``dtype``."""
    generator = torch.Generator().manual_seed(seed)
    return (around + scale * torch.randn(shape, generator=generator, dtype=torch.float64)).to(dtype)


class C0_Norm(nn.Module):
    """llama norm over [1] of a [3, 1, 2, 1] tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        h = x
        h = h.to(x.dtype)
        h = h.to(torch.float32)
        v = h
        m = (v.pow(2)).mean(3, keepdim=True)
        a = m + 0.001
        r = torch.rsqrt(a)
        n = h * r
        n = n.to(x.dtype)
        n = n.to(torch.float32)
        return n


class C0_Case(nn.Module):
    """case s0-c0: llama norm; float32 [3, 1, 2, 1]; channels-last"""

    def __init__(self):
        super().__init__()
        self.norm = C0_Norm()

    def forward(self, x):
        out = self.norm(x)
        return (out,)


def C0_inputs():
    """The inputs of case s0-c0: x."""
    x = _rand((3, 1, 2, 1), 360254, 0.001)
    x = x.to(torch.float32).contiguous(memory_format=torch.channels_last)
    return (x,)


MODULE = C0_Case
INPUTS = C0_inputs
MODE, BACKEND, QUANTIZATION_CAPTURE = 'capture', 'aten', False
NEAR_MISS = None
EXPECTED = {'norm': ((1,), {0.00099945068359375, 0.001, 0.0010000000474974513, 0.0010004043579101562})}

# The generator's description of the case(s), for `python -m edgefuse.fuzz --replay THIS_FILE`.
SPEC = [{'__type__': 'CaseSpec',
  'seed': 0,
  'index': 0,
  'shape': (3, 1, 2, 1),
  'dtype': 'float32',
  'norm': {'__type__': 'NormSpec',
           'form': 'llama',
           'pre': ({'__type__': 'Cast', 'kind': 'to', 'dtype': 'input'},
                   {'__type__': 'Cast', 'kind': 'to', 'dtype': 'float32'}),
           'var_pre': (),
           'square': 'pow2',
           'dims': 1,
           'mean_dims': None,
           'keepdim': True,
           'eps': 0.001,
           'eps_how': 'right',
           'eps_dtype': 'float32',
           'inverse': 'rsqrt',
           'dims_style': 'pos',
           'scaled': 'same',
           'rounded_via': 'float16',
           'scale_left': False,
           'mid': ({'__type__': 'Cast', 'kind': 'to', 'dtype': 'input'},
                   {'__type__': 'Cast', 'kind': 'to', 'dtype': 'float32'}),
           'weight': None,
           'post': (),
           'groups': 1,
           'also_return_normalized': False},
  'channels_last': True,
  'scale': 0.001,
  'zero_row': False,
  'residual': False,
  'feed': None,
  'heads': 1,
  'heads_view': 'reshape',
  'tails': (),
  'return_input': False,
  'near_miss': None,
  'input_seed': 360254}]

# --- the check --------------------------------------------------------------------------------------

import copy
import sys
import traceback

import edgefuse
from edgefuse.fuzz.localize import pair, replay
from edgefuse.fuzz.tolerance import ULPS, compare_at, output_tolerance_dtypes
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
    local = replay(base.module(), rewritten, pair(base.module(), rewritten, new), inputs) if new else None
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
