"""The ``edgefuse-xnnpack`` recipe's own refusal, as optimum-executorch's ``xnnpack`` recipe refuses: a model
loaded for ExecuTorch's custom SDPA whose exported program does not call it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from edgefuse.hf.recipe import _check_custom_sdpa


def _model(attention: str):
    return SimpleNamespace(config=SimpleNamespace(_attn_implementation=attention))


def _programs():
    return {"forward": SimpleNamespace(graph_module=torch.fx.symbolic_trace(torch.nn.Linear(4, 4)))}


def test_a_model_loaded_for_custom_sdpa_must_call_it_in_its_program():
    with pytest.raises(ValueError, match="'custom_sdpa' not found in the graph"):
        _check_custom_sdpa(_model("custom_sdpa"), _programs())
    _check_custom_sdpa(_model("sdpa"), _programs())  # another attention: nothing to look for
