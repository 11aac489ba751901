"""The built-in tiny models build, run and export with torch.export."""

import pytest
import torch

from edgefuse.inputs.models import MODEL_NAMES, build_model


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_exports_and_runs(name, tiny_program):
    module, inputs, ep = tiny_program(name)  # build_model's default size: 8 tokens
    assert all(x.dtype == torch.int64 and x.shape == (1, 8) for x in inputs)
    with torch.no_grad():
        eager = module(*inputs)
    assert eager.shape == (1, 8, 128)
    assert eager.dtype == torch.float32
    assert torch.isfinite(eager).all()
    assert eager.std() > 0

    with torch.no_grad():
        exported = ep.module()(*inputs)
    torch.testing.assert_close(exported, eager)


def test_build_is_deterministic():
    (a, inputs_a), (b, inputs_b) = build_model("tiny-llama"), build_model("tiny-llama")
    assert all(torch.equal(x, y) for x, y in zip(inputs_a, inputs_b))
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), name


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError) as err:
        build_model("tiny-nope")
    for name in MODEL_NAMES:
        assert name in str(err.value)
