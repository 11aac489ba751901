"""``python -m edgefuse.tools.qnn_check``: ``--seed`` draws each model's weights and inputs, a seed it cannot
use is an error naming the option before any work, and a quantized row gives its error in steps of its
output's quantization, its mean in those steps and against float eager, and its module's distance from
float eager."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import edgefuse.compare.qnn_flows
import edgefuse.inputs.qnn_models
from edgefuse.compare.qnn_flows import QnnProgram
from edgefuse.tools import qnn_check
from edgefuse.tools.qnn_check import HEADER, main


@pytest.mark.parametrize("seed", ["-1", str(2**63 - 1)])
def test_a_seed_out_of_bounds_names_the_option(seed, capsys, monkeypatch):
    monkeypatch.setattr(edgefuse.compare.qnn_flows, "require_libraries", lambda: pytest.fail("work began"))
    with pytest.raises(SystemExit) as exit_:
        main(["--models", "et-llama-hd32", "--precisions", "16a8w", "--seed", seed])
    assert exit_.value.code == 2
    assert "--seed is a whole number from 0 to 9223372036854775806" in capsys.readouterr().err


class _Stop(Exception):
    """Ends :func:`qnn_check.check` once it has built its model."""


def test_the_command_hands_its_seed_to_each_check_0_by_default(monkeypatch):
    seeds = []
    monkeypatch.setattr(edgefuse.compare.qnn_flows, "require_libraries", lambda: None)
    monkeypatch.setattr(qnn_check, "check", lambda name, precision, soc, say, seed: seeds.append(seed) or ([], []))
    main(["-q", "--models", "et-llama-hd32,et-llama-hd64", "--precisions", "16a8w", "--seed", "5"])
    main(["-q", "--models", "et-llama-hd32", "--precisions", "16a8w"])
    assert seeds == [5, 5, 0]


def test_a_check_draws_its_model_from_the_seed(monkeypatch):
    drawn = []

    def build(name, seed=0):
        drawn.append((name, seed))
        raise _Stop

    monkeypatch.setattr(edgefuse.inputs.qnn_models, "build_qnn_model", build)
    with pytest.raises(_Stop):
        qnn_check.check("et-llama-hd32", "16a8w", "SM8650", lambda _: None, seed=7)
    assert drawn == [("et-llama-hd32", 7)]


#: A lowered program as a row reads it: the QNN RmsNorm ops it compiled.
_LOWERED = SimpleNamespace(graphs=SimpleNamespace(rms_norms=0))


def test_a_quantized_row_gives_its_error_in_output_steps_and_its_modules_distance_from_float():
    program = QnnProgram("stock", "16a8w", "SM8650", lowered=_LOWERED, error=6e-4, allowed=1e-3, step=2e-4,
                         float_error=8e-3, module_float_error=7e-3, rounding_down_error=1e-4, within=True)
    row = dict(zip(HEADER, qnn_check._row("et-llama-hd32", "16a8w", program, None)))
    assert row["max err"] == "6.00e-04" and row["err steps"] == "3.00"
    assert row["err steps, RmsNorm rounding down"] == "0.50"
    assert row["vs float"] == "8.00e-03" and row["module vs float"] == "7.00e-03"


def test_a_quantized_row_gives_its_mean_errors_in_output_steps_and_against_float():
    program = QnnProgram("stock", "16a8w", "SM8650", lowered=_LOWERED, error=6e-4, allowed=1e-3, step=2e-4,
                         mean_error=3e-4, float_error=8e-3, mean_float_error=2e-3, rounding_down_error=1e-4,
                         rounding_down_mean_error=5e-5, within=True)
    row = dict(zip(HEADER, qnn_check._row("et-llama-hd32", "16a8w", program, None)))
    assert row["mean err steps"] == "1.50" and row["mean vs float"] == "2.000e-03"
    assert row["err steps, RmsNorm rounding down"] == "0.50" and row["mean err steps, RmsNorm rounding down"] == "0.25"


def test_an_fp16_row_has_no_steps():
    program = QnnProgram("stock", "fp16", "SM8650", lowered=_LOWERED, error=1e-3, allowed=2e-3, within=True)
    row = dict(zip(HEADER, qnn_check._row("et-llama-hd32", "fp16", program, None)))
    assert row["err steps"] == "-" and row["err steps, RmsNorm rounding down"] == "-" and row["module vs float"] == "-"
    assert row["mean err steps"] == "-" and row["mean vs float"] == "-" and row["mean err steps, RmsNorm rounding down"] == "-"
