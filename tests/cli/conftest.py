"""The folder the command tests name their models in."""

from __future__ import annotations

import pytest
import torch

from edgefuse.inputs.modelspec import resolve
from tests.cli.command_runs import MODELS_PY


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with models.py (the file models above) and block.pt2 (a saved float16 program)."""
    path = tmp_path_factory.mktemp("cli")
    (path / "models.py").write_text(MODELS_PY)
    spec = resolve(f"{path / 'models.py'}:block", torch.float16)
    torch.export.save(spec.export(), str(path / "block.pt2"))
    return path
