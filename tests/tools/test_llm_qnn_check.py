"""``python -m edgefuse.tools.llm_qnn_check``: a mask, a calibration or a seed it cannot use is an error
naming the option, before any work; ``--seed`` draws the weights and the calibration prompt."""

from __future__ import annotations

import pytest

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
