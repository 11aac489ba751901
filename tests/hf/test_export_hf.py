"""``edgefuse export-hf --compare`` on Qwen3, Llama, Gemma3 and SmolLM3 saved locally with random weights:
stock's and edgefuse's programs side by side, no mean and no float cast outside edgefuse's delegates, and
both programs' logits against the eager model within the bound of ``python -m edgefuse.tools.llm_check``."""

from __future__ import annotations

import re

import pytest

from edgefuse.llm.pte import read_pte
from tests.hf.conftest import CASES
from tests.hf.hf_models import eager_logits, program_logits

pytestmark = pytest.mark.slow

#: The rows of the side-by-side table the measure reads, by label.
ROWS = ("means outside", "float casts outside", "integer casts outside", "kernels outside")


def table(stdout: str) -> dict[str, tuple[int, int]]:
    """The (stock, edgefuse) counts of each row of :data:`ROWS` that the command printed."""
    counts = {}
    for line in stdout.splitlines():
        label, *values = re.split(r"\s{2,}", line.strip())
        if label in ROWS:
            stock, ours = values
            counts[label] = (int(stock), int(ours))
    return counts


@pytest.mark.parametrize("name", CASES)
def test_export_hf_prints_stock_beside_edgefuse_with_no_mean_and_no_float_cast_outside(hf_runs, name):
    run = hf_runs[name]
    assert run.code == 0, run.stdout
    counts = table(run.stdout)
    assert set(counts) == set(ROWS), run.stdout
    stock, ours = read_pte(run.stock), read_pte(run.edgefuse)
    assert counts["means outside"] == (stock.means, 0)
    assert counts["float casts outside"] == (stock.float_casts, 0)
    assert counts["integer casts outside"] == (stock.integer_casts, ours.integer_casts)
    assert counts["kernels outside"] == (stock.kernel_count, ours.kernel_count)
    assert ours.means == 0 and ours.float_casts == 0
    assert stock.means > 0  # what edgefuse is for: stock's norms leave their means outside
    assert "integer casts turn integers into floats" in run.stdout
    assert f"wrote {run.stock} and {run.edgefuse}" in run.stdout


@pytest.mark.parametrize("name", CASES)
def test_both_programs_logits_are_within_the_bound_of_the_dtype(hf_runs, name):
    """Each program over a prompt and decode steps against the eager model in its dtype (quantized as
    optimum quantizes it): within the LLM checks' bound; in 8da4w, edgefuse within stock's own error."""
    from edgefuse.tools.llm_check import checked_logits

    run = hf_runs[name]
    quantized = ("8da4w", "8w") if run.quantized else (None, None)
    expected = eager_logits(run.model_dir, run.dtype, *quantized)
    vocab = expected[0].shape[-1]
    paths = {"stock": run.stock, "edgefuse": run.edgefuse}
    logits = {how: program_logits(path, vocab) for how, path in paths.items()}
    checks = checked_logits(expected, logits, paths, run.dtype, run.quantized)
    for how, check in checks.items():
        assert check.matches, (how, check.errors, check.allowed, check.versus_stock, check.versus_stock_allowed)
