"""The four tiny Hugging Face models, saved once, and their exports by ``edgefuse export-hf``, made once per
session and shared by the tests that read them (each export takes half a minute or more)."""

from __future__ import annotations

import contextlib
import io
import json
import time
from dataclasses import dataclass

import pytest
import torch

from tests.hf.hf_models import save_model
from tests.optional import require_optimum

#: Each model with the options it is exported with: every dtype the recipe takes, one per model.
CASES = {
    "llama": ("float32", ()),
    "qwen3": ("float16", ()),
    "smollm3": ("bfloat16", ()),
    "gemma3": ("float32", ("--qlinear", "8da4w", "--qembedding", "8w")),
}

#: The models exported with ``--compare``, stock beside edgefuse: float16, where stock leaves both means and
#: float casts and edgefuse's logits are held to stock's too, and 8da4w, where stock's own error is
#: edgefuse's allowance. The others are exported with edgefuse's recipe alone, which the same rules hold.
COMPARED = ("qwen3", "gemma3")

#: The options every case shares: ExecuTorch's custom SDPA and a short KV cache.
SHARED = ("--use_custom_sdpa", "--max_seq_len", "32")


def custom_kv_cache() -> tuple[str, ...]:
    """``--use_custom_kv_cache`` where the installed transformers has the HybridCache optimum-executorch
    1.1.0's cache imports (5.0.0rc1, which ``pip install optimum-executorch`` brings); none elsewhere."""
    import transformers.cache_utils

    return ("--use_custom_kv_cache",) if hasattr(transformers.cache_utils, "HybridCache") else ()


@dataclass
class HfRun:
    """One ``edgefuse export-hf`` of a model: its folder, exit code, stdout, wall time, programs (``stock`` is
    None without ``--compare``)."""

    model_dir: str
    dtype: torch.dtype
    quantized: bool
    code: int
    stdout: str
    seconds: float
    stock: str | None
    edgefuse: str


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory) -> dict[str, str]:
    """The four models saved with ``save_pretrained`` in a temporary folder, by name."""
    require_optimum()
    folder = str(tmp_path_factory.mktemp("hf-models"))
    return {name: save_model(folder, name) for name in CASES}


@pytest.fixture(scope="session")
def hf_runs(hf_models, tmp_path_factory) -> dict[str, HfRun]:
    """Each model exported by ``edgefuse -q export-hf MODEL -o OUT``, in this process: stock and edgefuse
    (``--compare``) for :data:`COMPARED`, edgefuse alone for the others."""
    from edgefuse.cli import main

    runs = {}
    for name, (dtype, extra) in CASES.items():
        out = tmp_path_factory.mktemp(f"hf-{name}")
        compare = ("--compare",) if name in COMPARED else ()
        argv = ["-q", "export-hf", hf_models[name], "-o", str(out), *compare, "--dtype", dtype, *SHARED,
                *custom_kv_cache(), *extra]
        stdout = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(stdout):
            code = main(argv)
        runs[name] = HfRun(hf_models[name], getattr(torch, dtype), bool(extra), code, stdout.getvalue(),
                           time.perf_counter() - start, str(out / "model.stock.pte") if compare else None,
                           str(out / "model.pte"))
    return runs


@pytest.fixture
def model_dir(tmp_path):
    """A folder holding only the config.json of a Llama (enough for every check before the load)."""
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return folder
