"""Lower a module with edgefuse (and stock), run the .pte in the released runtime, compare with eager."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.export import export

from edgefuse.core.verify import TOLERANCES, tolerance
from edgefuse.xnnpack.lowering import lower, lower_stock
from edgefuse.core._fx import ops_outside
from edgefuse.xnnpack.inspect import lowered_modules, node_type_counts, node_types, run_pte, to_pte

torch.set_num_threads(1)  # eager OpenMP workers left spinning slow the runtime on 2 cores

#: Units in the last place of the output's largest value (at least 1) allowed against eager: the
#: delegate sums in another order than ATen (a fully-connected against 1/W, or pooling), and a float16
#: program rounds each intermediate once more or less than eager (the "lowered program" tolerance).
ULPS = TOLERANCES["lowered program"].ulps


@dataclass
class Result:
    manager: object
    outputs: list
    expected: list
    outside: list
    types: list
    counts: object

    @property
    def delegates(self) -> int:
        return len(self.types)


def _flat(value):
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]


def lower_and_run(module, inputs, run_inputs=None, stock=False, dynamic_shapes=None, **options) -> Result:
    """Export and lower ``module``; run the .pte on ``inputs`` (and each tuple of ``run_inputs``)."""
    module = module.eval()
    program = export(module, tuple(inputs), dynamic_shapes=dynamic_shapes)
    if stock:
        manager = lower_stock(program, **options)
    else:
        manager = lower(program, **options)
    outside, types, counts = ops_outside(manager), node_types(manager), node_type_counts(manager)
    pte = to_pte(manager)
    outputs, expected = [], []
    for args in [tuple(inputs)] + list(run_inputs or []):
        with torch.no_grad():
            expected.append(_flat(module(*args)))
        outputs.append(run_pte(pte, args))
    return Result(manager, outputs, expected, outside, types, counts)


def assert_matches(result: Result, ulps: float | None = None) -> None:
    """Every output of every run matches eager at its dtype's tolerance, with the same shape and dtype."""
    for run, (actual, expected) in enumerate(zip(result.outputs, result.expected)):
        assert len(actual) == len(expected), f"run {run}: {len(actual)} outputs, eager has {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert a.shape == e.shape, f"run {run} output {i}: shape {tuple(a.shape)}, eager {tuple(e.shape)}"
            assert a.dtype == e.dtype, f"run {run} output {i}: dtype {a.dtype}, eager {e.dtype}"
            allowed = tolerance(e.dtype, e, ulps if ulps is not None else ULPS)
            error = float((a.double() - e.double()).abs().max()) if e.numel() else 0.0
            assert error <= allowed, f"run {run} output {i}: max error {error:.3g} above {allowed:.3g}"


def means_outside(result: Result) -> list[str]:
    return [op for op in result.outside if "mean" in op]


def casts_outside(result: Result) -> list[str]:
    return [op for op in result.outside if "to_dim_order_copy" in op or "_to_copy" in op]
