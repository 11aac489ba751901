"""Differential fuzzing of edgefuse's RMSNorm recomposition: generated norm graphs, near misses, hostile input.

``edgefuse fuzz --cases N --seed S`` (or ``python -m edgefuse.fuzz``) generates N small modules around
RMSNorm, exports each in capture mode and (on every case, or a sample: ``--edge-every``) in both edge
modes, rewrites it with :func:`edgefuse.recompose_rms_norm` for every backend profile, and checks what
:mod:`.check` lists: no exception escapes the pass, every output keeps its dtype and matches eager at a
tolerance derived from the dtypes, every rebuilt norm matches the decomposed norm it replaced, a near
miss is never rebuilt. ``--xnnpack-every K`` adds edgefuse's XNNPACK flow on a sample (the ``.pte`` runs
in ``executorch.runtime`` and matches), ``--hostile-every K`` damaged graphs of a sample and the fixed
malformed graphs. It prints counts (generated, rebuilt, left, mismatches, exceptions, ...) and writes each
failing case as a standalone reproducer file to ``./edgefuse-fuzz-failures`` (``--out``), created only
when a case fails.

The parts, one job each: :mod:`.spec` (a case as data), :mod:`.generate` (the seeded generator),
:mod:`.render` (a case as Python source, and the module built from it), :mod:`.programs` (edge export),
:mod:`.tolerance`, :mod:`.localize` (norm-by-norm comparison), :mod:`.check` (the properties of one
check), :mod:`.units` (cases side by side), :mod:`.xnnpack`, :mod:`.hostile`, :mod:`.malformed`,
:mod:`.runner`, :mod:`.summary`, :mod:`.reproducer`, :mod:`.validate` (a replayed SPEC checked against
what the generator writes), :mod:`.shrink`, :mod:`.cli`, and :mod:`.trust` with :mod:`.trust_configs`
and :mod:`.trust_ptes` (hostile and mutated ``.pt2`` archives, reproducers, ``export-llm`` configs and
``.pte`` programs for edgefuse's readers of other people's files).

Why a seeded generator of our own, not hypothesis strategies
------------------------------------------------------------
* **A case is a pure function of (seed, index).** Each case draws from ``random.Random(f"...:{seed}:{index}")``,
  so ``--seed S`` names the same 10,000 modules on every machine and every run, any single case can be
  regenerated on its own (``--start I --cases 1``), and a CI run is a prefix of the long run. Hypothesis
  derives examples from its own database and health-checked search; its ``@seed`` is per-test, runs are
  shaped by shrinking and example-database replay, and it is built to run inside a test, not as a
  counting command line over a fixed population.
* **Reproducers without the generator.** A case is a small frozen dataclass (:mod:`.spec`), rendered to
  plain Python source (:mod:`.render`) that the fuzzer itself executes; the reproducer file holds that
  same source, so it rebuilds the module and inputs with torch alone. Hypothesis' output is a call into
  strategies (or a ``@reproduce_failure`` blob) that needs the strategies' code at the same version.
* **Cost per example.** Each case costs an export and two ``to_edge`` calls (about a second each on this
  hardware): hypothesis' shrinker would spend hundreds of exports per failure and its deadline and
  too-slow health checks fight with that. :mod:`.shrink` does a bounded greedy shrink over the spec's
  fields instead (drop a neighbour, a cast, the weight; smaller shapes), keeping a near miss a near miss.
* **Batching.** Because ``to_edge`` has a large fixed cost per call, several cases are exported side by
  side in one module and attributed back by module path, graph input and output position
  (:mod:`.units`, :mod:`.check`); that needs control of the population that an own generator gives.
"""

from typing import TYPE_CHECKING

from edgefuse.core.lazy import lazy_names

#: Each public name and the module that defines it, imported on first use (PEP 562): ``python -m
#: edgefuse.fuzz`` imports this package before it can silence the warnings torch and torchao log as they
#: are imported. The generator itself is ``edgefuse.fuzz.generate.generate``: a package name may not
#: also be a submodule's. A reproducer file imports edgefuse through these names (and the root's) alone.
_PUBLIC: dict[str, str] = {
    "CHECKS": "edgefuse.fuzz.check",
    "CaseResult": "edgefuse.fuzz.check",
    "Finding": "edgefuse.fuzz.check",
    "features": "edgefuse.fuzz.generate",
    "norm_by_norm": "edgefuse.fuzz.localize",
    "build": "edgefuse.fuzz.render",
    "source": "edgefuse.fuzz.render",
    "FORMS": "edgefuse.fuzz.spec",
    "NEAR_MISSES": "edgefuse.fuzz.spec",
    "CaseSpec": "edgefuse.fuzz.spec",
    "TOLERANCES": "edgefuse.fuzz.tolerance",
    "ULPS": "edgefuse.fuzz.tolerance",
    "compare_at": "edgefuse.fuzz.tolerance",
    "output_tolerance_dtypes": "edgefuse.fuzz.tolerance",
    "run_unit": "edgefuse.fuzz.units",
}

__all__ = sorted([*_PUBLIC, "main"])

if TYPE_CHECKING:
    from edgefuse.fuzz.check import CHECKS, CaseResult, Finding
    from edgefuse.fuzz.generate import features
    from edgefuse.fuzz.localize import norm_by_norm
    from edgefuse.fuzz.render import build, source
    from edgefuse.fuzz.spec import FORMS, NEAR_MISSES, CaseSpec
    from edgefuse.fuzz.tolerance import TOLERANCES, ULPS, compare_at, output_tolerance_dtypes
    from edgefuse.fuzz.units import run_unit

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)


def main(argv: list[str] | None = None) -> int:
    """``edgefuse fuzz`` / ``python -m edgefuse.fuzz``: exit code 0 only when no check failed."""
    from edgefuse.fuzz.cli import main as cli_main

    return cli_main(argv)
