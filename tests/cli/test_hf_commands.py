"""``edgefuse export-hf``'s bad input: exit 2 with the reason (3 without optimum-executorch), before torch is
loaded or a model read; in this process, and as a user meets it, in a new one."""

from __future__ import annotations

import json
import sys

import pytest

from edgefuse.cli import main
from edgefuse.inputs.errors import UNAVAILABLE, USAGE
from tests.cli.command_runs import last_line
from tests.optional import require_optimum


@pytest.fixture
def folders(tmp_path):
    """``llama`` (a config.json alone: enough for every check before the load) and ``empty`` (none)."""
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "empty").mkdir()
    return tmp_path


#: Bad input: the arguments after ``export-hf``, and what the message on stderr holds.
BAD_INPUT = {
    "no config.json": (["empty", "-o", "out"], "empty has no config.json: give the folder a model was saved in"),
    "unknown recipe": (["llama", "-o", "out", "--recipe", "coreml"],
                       "argument --recipe: invalid choice: 'coreml' (choose from"),
    "unknown option": (["llama", "-o", "out", "--qlinear_group_size", "64"],
                       "unrecognized arguments: --qlinear_group_size 64"),
    "bad choice": (["llama", "-o", "out", "--qlinear", "8da3w"],
                   "argument --qlinear: invalid choice: '8da3w' (choose from"),
    "compare with stock's recipe": (["llama", "-o", "out", "--compare", "--recipe", "xnnpack"],
                                    "--compare exports with both recipes; leave out --recipe xnnpack"),
    "an output folder that cannot be made": (["llama", "-o", "/proc/edgefuse-x"],
                                             "cannot write the output folder /proc/edgefuse-x"),
    "an output folder below a file": (["llama", "-o", "llama/config.json/out"], "config.json is not a folder"),
}


def _in(folder, argv: list[str]) -> list[str]:
    return [str(folder / argv[0]), "-o", str(folder / argv[2]), *argv[3:]]


def exit_code(argv: list[str]) -> int:
    """``edgefuse`` run on ``argv`` in this process: its exit code, argparse's refusals included."""
    try:
        return main(argv)
    except SystemExit as ended:
        return ended.code


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_exits_2_with_the_reason_before_anything_is_written(folders, capsys, case):
    argv, message = BAD_INPUT[case]
    assert exit_code(["-q", "export-hf", *_in(folders, argv)]) == USAGE
    assert message in capsys.readouterr().err
    assert not (folders / "out").exists()


def test_a_program_already_in_the_output_folder_exits_2_and_is_left_as_it_was(folders, capsys):
    (folders / "out").mkdir()
    (folders / "out" / "model.pte").write_bytes(b"theirs")
    assert main(["-q", "export-hf", str(folders / "llama"), "-o", str(folders / "out")]) == USAGE
    assert "model.pte is already there: the export writes a new file only" in capsys.readouterr().err
    assert (folders / "out" / "model.pte").read_bytes() == b"theirs"


def test_without_optimum_executorch_the_command_exits_3_and_says_how_to_install_it(folders, capsys, monkeypatch):
    for name in ("optimum", "optimum.exporters", "optimum.exporters.executorch"):  # as if never installed
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["-q", "export-hf", str(folders / "llama"), "-o", str(folders / "out")]) == UNAVAILABLE
    assert "optimum-executorch is not installed: pip install optimum-executorch" in capsys.readouterr().err


def test_a_model_optimum_cannot_load_exits_2_with_its_reason_before_any_lowering(folders, capsys):
    """A config.json and no weights: transformers' own message, exit 2, and no output folder left."""
    require_optimum()
    assert main(["-q", "export-hf", str(folders / "llama"), "-o", str(folders / "out")]) == USAGE
    err = capsys.readouterr().err
    assert "optimum could not load" in err and "(llama) for text-generation" in err, err
    assert "Traceback" not in err
    assert not (folders / "out").exists()


@pytest.mark.slow
def test_bad_input_exits_2_with_the_reason_before_torch_is_loaded_in_a_new_process(folders):
    """As a user meets it: the reason on the last line, no traceback, and no notice of loading torch."""
    for case, (argv, message) in BAD_INPUT.items():
        done = subprocess_run(folders, argv)
        assert done.returncode == USAGE, (case, done.stderr)
        assert message in last_line(done.stderr), case
        assert "Traceback" not in done.stderr and "loading torch" not in done.stderr, case


def subprocess_run(folder, argv: list[str]):
    """``edgefuse export-hf ARGS`` in ``folder``, with its progress lines (so a notice of loading torch shows)."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "edgefuse", "export-hf", *argv], cwd=folder, capture_output=True,
                          text=True, timeout=120)
