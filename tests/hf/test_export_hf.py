"""``edgefuse export-hf`` on Qwen3, Llama, Gemma3 and SmolLM3 saved locally with random weights, one dtype
each: no mean and no float cast outside edgefuse's delegates, and its logits against the eager model within
the bound of ``python -m edgefuse.tools.llm_check``; with ``--compare`` (Qwen3, Gemma3) stock's program
beside it, in the table and in the logits' check."""

from __future__ import annotations

import re

import pytest
import torch

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
    if name == "gemma3":  # its gelu_pytorch_tanh runs inside edgefuse's delegates, no portable GELU between them
        assert ours.count(("aten::gelu",)) == 0, ours.kernels
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


@pytest.mark.parametrize("name, one_token", [("qwen3", False), ("gemma3", True)])
def test_a_timing_feeds_optimums_programs_their_cache_positions_as_the_check_does(hf_runs, name, one_token):
    """optimum's Qwen3 takes a whole prompt and each token's cache position; its Gemma3, exported with static
    shapes, one token a call. The timing reads that from the program (``inputs_of``) and runs the prompt and
    decode steps so; its last logits are the check's, which feeds positions by hand."""
    from edgefuse.compare.llm_programs import load_llm_kernels
    from edgefuse.hf.logits import program_logits as checked
    from edgefuse.llm.latency import inputs_of, time_prefill_decode
    from edgefuse.runtime import LoadedProgram
    from tests.hf.hf_models import DECODE, PREFILL, tokens

    load_llm_kernels()
    loaded = LoadedProgram(hf_runs[name].edgefuse)
    taken = inputs_of(loaded.method)
    assert (taken.positions, taken.one_token) == (not one_token, one_token)
    sequence = tokens(256)
    steps = sequence[0, PREFILL:].reshape(DECODE, 1, 1)
    timing = time_prefill_decode([loaded.method], sequence[:, :PREFILL], steps, 1, 0)
    expected = checked(hf_runs[name].edgefuse, sequence, PREFILL)[-1]
    assert torch.equal(timing.last_logits[0][:, -1], expected)


def test_the_eager_model_is_the_saved_one_built_from_its_folder_alone(hf_models, tmp_path):
    """``edgefuse.hf.logits.eager_model`` builds the model from config.json and the safetensors weights (no
    download, no from_pretrained): every weight the file holds, the tied output projection the embedding."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from edgefuse.hf.logits import eager_model
    from tests.hf.hf_models import config

    tied = config("llama")
    tied.tie_word_embeddings = True
    torch.manual_seed(1)
    saved_model = AutoModelForCausalLM.from_config(tied).eval()
    saved_model.save_pretrained(tmp_path / "tied")
    rebuilt = eager_model(tmp_path / "tied", torch.float32)
    assert rebuilt.lm_head.weight is rebuilt.model.embed_tokens.weight
    sequence = torch.randint(3, 256, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(rebuilt(input_ids=sequence).logits, saved_model(input_ids=sequence).logits)

    for name, folder in hf_models.items():
        model = eager_model(folder, torch.float32)
        state = model.state_dict()
        saved = load_file(f"{folder}/model.safetensors")
        assert all(torch.equal(state[key], value) for key, value in saved.items()), name
        assert set(state) - set(saved) <= {"lm_head.weight"}, name
        assert not model.training, name
