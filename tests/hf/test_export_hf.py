"""``edgefuse export-hf`` on Qwen3, Llama, Gemma3 and SmolLM3 saved locally with random weights, one dtype
each: no mean and no float cast outside edgefuse's delegates, and its logits against the eager model within
the bound of ``python -m edgefuse.tools.llm_check``; with ``--compare`` (Qwen3, Gemma3) stock's program
beside it, in the table and in the logits' check."""

from __future__ import annotations

import re

import pytest

from edgefuse.llm.pte import read_pte
from tests.hf.conftest import CASES
from tests.hf.hf_models import eager_logits, program_logits

pytestmark = pytest.mark.slow

#: The rows of the side-by-side table the measure reads, by label.
ROWS = ("means outside", "float casts outside", "integer casts outside", "kernels outside")


def table(stdout: str) -> dict[str, tuple[int, ...]]:
    """The counts of each row of :data:`ROWS` that the command printed, one a program (stock's first)."""
    counts = {}
    for line in stdout.splitlines():
        label, *values = re.split(r"\s{2,}", line.strip())
        if label in ROWS:
            counts[label] = tuple(int(value) for value in values)
    return counts


@pytest.mark.parametrize("name", CASES)
def test_export_hf_prints_its_programs_with_no_mean_and_no_float_cast_outside_edgefuses(hf_runs, name):
    run = hf_runs[name]
    assert run.code == 0, run.stdout
    counts = table(run.stdout)
    assert set(counts) == set(ROWS), run.stdout
    ours = read_pte(run.edgefuse)
    programs = [ours] if run.stock is None else [read_pte(run.stock), ours]
    assert counts["means outside"] == tuple(program.means for program in programs)
    assert counts["float casts outside"] == tuple(program.float_casts for program in programs)
    assert counts["integer casts outside"] == tuple(program.integer_casts for program in programs)
    assert counts["kernels outside"] == tuple(program.kernel_count for program in programs)
    assert ours.means == 0 and ours.float_casts == 0
    assert "integer casts turn integers into floats" in run.stdout
    if run.stock is None:
        substituted = re.search(r"edgefuse substituted (\d+) means", run.stdout)
        assert substituted and int(substituted[1]) > 0, run.stdout  # the model's norms were rebuilt
        assert f"wrote {run.edgefuse}" in run.stdout
    else:
        assert programs[0].means > 0  # what edgefuse is for: stock's norms leave their means outside
        assert f"wrote {run.stock} and {run.edgefuse}" in run.stdout


@pytest.mark.parametrize("name", CASES)
def test_the_programs_logits_are_within_the_bound_of_the_dtype(hf_runs, name):
    """Each program over a prompt and decode steps against the eager model in its dtype (quantized as
    optimum quantizes it): within the LLM checks' bound; beside stock, in float also within the bound of
    stock's logits, in 8da4w within stock's own error."""
    from edgefuse.tools.llm_check import checked_logits

    run = hf_runs[name]
    quantized = ("8da4w", "8w") if run.quantized else (None, None)
    expected = eager_logits(run.model_dir, run.dtype, *quantized)
    vocab = expected[0].shape[-1]
    paths = {"edgefuse": run.edgefuse} if run.stock is None else {"stock": run.stock, "edgefuse": run.edgefuse}
    logits = {how: program_logits(path, vocab) for how, path in paths.items()}
    checks = checked_logits(expected, logits, paths, run.dtype, run.quantized)
    for how, check in checks.items():
        assert check.matches, (how, check.errors, check.allowed, check.versus_stock, check.versus_stock_allowed)
