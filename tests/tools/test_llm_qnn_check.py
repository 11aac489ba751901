"""``python -m edgefuse.tools.llm_qnn_check``: a mask, a calibration or a seed it cannot use is an error
naming the option, before any work; ``--seed`` draws the weights and the calibration prompt."""

from __future__ import annotations

import pytest
import torch

import edgefuse.llm.eager
from edgefuse.tools import llm_qnn_check
from edgefuse.tools.llm_qnn_check import CASES, calibration_arguments, check_case, main


@pytest.mark.parametrize("argv, message", [
    (["--mask", "3"], "--mask is a negative float16 value"),
    (["--mask=-1e6"], "--mask is a negative float16 value"),
    (["--mask", "nan"], "--mask is a negative float16 value"),
    (["--calibration", "-1"], "--calibration from 0 to 128 calls"),
    (["--calibration", "129"], "--calibration from 0 to 128 calls"),
    (["--seed", "-1"], "--seed is a whole number from 0"),
])
def test_each_bad_option_names_itself(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_seed_reaches_each_case(monkeypatch):
    """The command hands ``--seed`` to every case it checks, 0 when not given."""
    import edgefuse.compare.qnn_flows

    seeds = []
    monkeypatch.setattr(edgefuse.compare.qnn_flows, "require_libraries", lambda: None)
    monkeypatch.setattr(llm_qnn_check, "check_case", lambda *args, seed, **kwargs: seeds.append(seed) or {})
    main(["--cases", "llama-16a4w,llama-8a8w", "--seed", "3"])
    main(["--cases", "llama-16a4w"])
    assert seeds == [3, 3, 0]


class _Stop(Exception):
    """Ends :func:`check_case` before it exports."""


def test_seed_draws_the_weights_and_the_calibration(monkeypatch, tmp_path):
    drawn = {}

    def weights(directory, params, seed=0):
        drawn["weights"] = seed
        return "params.json", "checkpoint.pth"

    def calibration(directory, vocab, calls, seed=0):
        drawn["calibration"] = seed
        raise _Stop

    monkeypatch.setattr(edgefuse.llm.eager, "write_small_model", weights)
    monkeypatch.setattr(llm_qnn_check, "calibration_arguments", calibration)
    with pytest.raises(_Stop):
        check_case(CASES["llama-16a4w"], str(tmp_path), calibration=16, seed=5)
    assert drawn == {"weights": 5, "calibration": 5}


def test_calibration_prompt_follows_the_seed_and_seed_0_keeps_the_first_one(tmp_path):
    """Seed 0 calibrates on the prompt the command always drew (from 1, so never the checked prompt, drawn
    from 0); another seed on another prompt."""
    from edgefuse.llm.eager import prompt_and_steps, token_text

    def data(seed):
        (override,) = [a for a in calibration_arguments(str(tmp_path), 256, 16, seed) if "calibration_data" in a]
        return override.split("=", 1)[1]

    first, _ = prompt_and_steps(256, llm_qnn_check.CALIBRATION_PROMPT, 0, seed=1)
    assert data(0) == token_text(first)
    assert data(0) != data(1) and data(1) != data(2)


class _NormModel(torch.nn.Module):
    """A converted module's shape as export_llm's QNN programs take it (tokens, then the position), with a
    quantized norm, or without one (``norm=False``: as stock's norms in pieces hold no ``rms_norm``); it counts
    its calls in a buffer, as a KV cache is written."""

    def __init__(self, norm: bool = True):
        super().__init__()
        self.norm = norm
        self.embedding = torch.nn.Embedding(16, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, tokens, input_pos):
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

        self.calls.add_(input_pos.new_ones(()))
        x = self.embedding(tokens) + input_pos
        y = torch.ops.aten.rms_norm.default(x, [8], None, 1e-6) if self.norm else x * 0.5
        ops = torch.ops.quantized_decomposed
        return ops.dequantize_per_tensor.default(ops.quantize_per_tensor.default(y, 0.01, 0, -128, 127, torch.int8),
                                                 0.01, 0, -128, 127, torch.int8)


def test_norms_rounding_down_runs_a_copy_with_each_norm_output_rounded_down():
    from edgefuse.tools.llm_qnn_check import norms_rounding_down

    torch.manual_seed(0)
    reference = torch.fx.symbolic_trace(_NormModel())
    prompt, steps = torch.tensor([[3, 5]]), torch.tensor([[[7]], [[9]]])
    got = norms_rounding_down(reference, prompt, steps)
    for logits, (token, position) in zip(got, [(5, 1), (7, 2), (9, 3)]):
        exact = torch.ops.aten.rms_norm.default(reference.embedding(torch.tensor([[token]])) + position, [8], None, 1e-6)
        assert torch.equal(logits, (torch.floor(exact / 0.01).clamp(-128, 127) * 0.01).reshape(-1))
    assert reference.calls == 0  # a copy ran: the reference's state is as it was
    assert norms_rounding_down(torch.fx.symbolic_trace(_NormModel(norm=False)), prompt, steps) is None


def test_each_row_gives_the_mean_errors():
    from edgefuse.tools.llm_qnn_check import HEADER, QnnProgramCheck, rows

    def check(how, rounding_down):
        return QnnProgramCheck(how, "p.pte", type("Contents", (), {"delegates": {}, "kernels": {}})(), 0, 0, 0,
                               "fake-quantized", errors=[0.1, 0.2], allowed=[1.0, 1.0], mean_errors=[0.01, 0.03],
                               rounding_down=rounding_down)

    table = rows(CASES["llama-16a4w"], {"stock": check("stock", []), "edgefuse": check("edgefuse", [0.002, 0.004])})
    mean, down = HEADER.index("mean err"), HEADER.index("mean err, RmsNorm rounding down")
    assert [(row[mean], row[down]) for row in table] == [("0.02", "-"), ("0.02", "0.003")]
