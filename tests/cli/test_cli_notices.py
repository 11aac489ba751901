"""Every ``edgefuse`` command says what it is about to do before it first imports torch or ExecuTorch; help
and a command that does not exist import neither. Each command runs in a new process only until its first
heavy import (:mod:`tests.first_import`), so this takes seconds, not the minutes the commands take."""

from __future__ import annotations

import pytest

from edgefuse.cli import COMMANDS
from edgefuse.inputs.errors import OK, USAGE
from tests.first_import import until_first_heavy_import

pytestmark = pytest.mark.slow  # each test starts edgefuse in a new process (stopped at its first heavy import)

#: A command line that parses for each command that loads torch and ExecuTorch, and what it then says.
ANNOUNCED = {
    "demo": (["demo"], "demo: building tiny-qwen3, rebuilding its norms for QNN and lowering it for XNNPACK"),
    "report": (["report", "tiny-llama"], "report tiny-llama: finding its norms and rebuilding them"),
    "lower": (["lower", "tiny-llama", "-o", "out.pte", "--backend", "qnn"],
              "lower tiny-llama: lowering it for qnn stock and with edgefuse"),
    "bench": (["bench", "tiny-llama"], "bench tiny-llama: lowering it for XNNPACK both ways and timing"),
    "fuzz": (["fuzz", "--cases", "1"], "fuzz: fuzzing edgefuse's rewrites"),
    "export-llm": (["export-llm", "--config", "llama.yaml"], "export-llm: running ExecuTorch's export_llm"),
    "bench-llm": (["bench-llm", "s.pte", "e.pte"], "bench-llm: timing s.pte against e.pte"),
    "export-hf": (["export-hf", "model", "-o", "out"], "export-hf model: running optimum-executorch's export"),
    "qnn-llama": (["qnn-llama", "--decoder_model", "stories260k"], "qnn-llama: compiling ExecuTorch's static Llama"),
}
#: The commands that load neither library up front: ``qnn setup`` downloads and lays out libraries first
#: (each step says so) and loads torch only for its self-check; ``qnn env`` never does.
UNANNOUNCED = {"qnn setup", "qnn env"}


def test_every_command_is_either_announced_or_loads_nothing_up_front():
    assert set(ANNOUNCED) | UNANNOUNCED == set(COMMANDS)
    assert {name for name, (_, _, notice) in COMMANDS.items() if notice is None} == UNANNOUNCED


@pytest.mark.parametrize("command", sorted(ANNOUNCED))
def test_a_command_says_what_it_does_before_torch_or_executorch_is_imported(command, tmp_path):
    argv, notice = ANNOUNCED[command]
    (tmp_path / "llama.yaml").write_text("base:\n  model_class: stories110m\n")  # export-llm reads it first
    (tmp_path / "model").mkdir()  # export-hf reads the model folder's config first
    (tmp_path / "model" / "config.json").write_text('{"model_type": "llama"}')
    ran = until_first_heavy_import(["-m", "edgefuse", *argv], tmp_path)
    assert ran.importing is not None, ran.stderr  # it went on to load them
    assert notice in ran.said[-1] and ran.said[-1].endswith("; loading torch and ExecuTorch"), ran.said


def test_quiet_says_nothing_before_the_import_either(tmp_path):
    ran = until_first_heavy_import(["-m", "edgefuse", "-q", "report", "tiny-llama"], tmp_path)
    assert ran.importing is not None and ran.said == [], ran.stderr


@pytest.mark.parametrize("argv", [["--help"], ["report", "--help"], ["qnn", "env", "--help"]])
def test_help_says_nothing_and_imports_neither(argv, tmp_path):
    """Help is text: nothing is about to be done, and printing it loads neither library."""
    ran = until_first_heavy_import(["-m", "edgefuse", *argv], tmp_path)
    assert (ran.code, ran.said, ran.importing) == (OK, [], None), ran.stderr


def test_a_command_that_does_not_exist_exits_2_with_the_list_of_those_that_do(tmp_path):
    ran = until_first_heavy_import(["-m", "edgefuse", "nope"], tmp_path)
    assert ran.code == USAGE and ran.importing is None, ran.stderr
    assert "invalid choice: 'nope'" in ran.stderr and "Traceback" not in ran.stderr
    for name in {command.split()[0] for command in COMMANDS}:
        assert f"'{name}'" in ran.stderr.splitlines()[-1], ran.stderr


def test_the_fuzzers_help_is_not_announced(tmp_path):
    """``edgefuse fuzz --help`` hands ``--help`` to the fuzzer: help again, so no line about work to come."""
    ran = until_first_heavy_import(["-m", "edgefuse", "fuzz", "--help"], tmp_path)
    assert ran.said == [], ran.stderr
