"""Bad input, as a user meets it: exit 2 and a message, never a traceback, in a real process."""

from __future__ import annotations

import os

import pytest
import torch


from edgefuse.inputs.errors import OK, USAGE  # noqa: E402
from edgefuse.inputs.models import MODEL_NAMES  # noqa: E402
from tests.cli.command_runs import MODELS_PY, last_line, run_commands  # noqa: E402

pytestmark = pytest.mark.slow


# --- bad input, as a user meets it (one process) --------------------------------------------------------

#: The bad input the tests below read one by one: each command's argv, by case name.
ONE_BY_ONE = {
    "unknown model": ["report", "tiny-nope"],
    "a function that raises": ["report", "models.py:raises"],
    "a missing .pt2": ["lower", "missing.pt2", "-o", "out.pte"],
}


def test_unknown_model_exits_2_and_lists_every_known_name(command_results):
    done = command_results["unknown model"]
    assert done["code"] == USAGE, done["stderr"]
    message = last_line(done["stderr"])
    assert "unknown model 'tiny-nope'" in message
    for name in MODEL_NAMES:
        assert name in message
    assert "Traceback" not in done["stderr"]
    assert done["stdout"] == ""


def test_a_file_function_that_raises_exits_2_and_says_where(command_results):
    done = command_results["a function that raises"]
    assert done["code"] == USAGE, done["stderr"]
    message = last_line(done["stderr"])
    assert "raises() raised RuntimeError: the checkpoint is not here" in message
    assert "models.py:" in message  # the line it was raised at
    assert "Traceback" not in done["stderr"]


def test_a_missing_pt2_exits_2(workdir, command_results):
    done = command_results["a missing .pt2"]
    assert done["code"] == USAGE, done["stderr"]
    assert "no such file 'missing.pt2'" in last_line(done["stderr"])
    assert not (workdir / "out.pte").exists()


#: Bad input, each with the message its last line on stderr must hold: all exit 2.
BAD_INPUT = {
    "corrupt .pt2": (["report", "corrupt.pt2"], "corrupt.pt2 is not a program saved with torch.export.save"),
    "syntax error": (["report", "syntax.py:build"], "importing syntax.py raised SyntaxError"),
    "-o a directory": (["lower", "models.py:block", "-o", "a_directory.pte"],
                       "cannot write the .pte to a_directory.pte: it is a directory"),
    "--map a directory": (["report", "models.py:block", "--map", "."],
                          "cannot write the delegate map to .: it is a directory"),
    "data-dependent": (["report", "models.py:data_dependent"], "does not export with torch.export"),
    "wrong inputs": (["report", "models.py:wrong_inputs"], "does not export with torch.export"),
    "not in the edge opset": (["report", "models.py:not_in_edge"], "ExecuTorch's to_edge rejects models.py:not_in_edge"),
    "stock does not lower": (["lower", "models.py:not_in_edge", "-o", "inv.pte"],
                             "ExecuTorch's XNNPACK lowering (to_edge_transform_and_lower) rejects this program"),
    "--map over -o": (["lower", "models.py:block", "-o", "same.pte", "--map", "same.pte"],
                      "the delegate map would be written to same.pte, which is also the .pte"),
    "--map over MODEL": (["lower", "block.pt2", "-o", "b.pte", "--map", "block.pt2"],
                         "the delegate map would be written to block.pt2, which is also the MODEL block.pt2"),
    "report --map over MODEL": (["report", "models.py:block", "--map", "models.py"],
                                "which is also the MODEL models.py:block"),
    "--map a hard link to MODEL": (["report", "models.py:block", "--map", "models_link.svg"],
                                   "which is also the MODEL models.py:block"),
    "sys.exit in the function": (["report", "exits.py:leave"], "calling leave() raised SystemExit: 0"),
    "sys.exit on import": (["report", "exits_on_import.py:leave"], "importing exits_on_import.py raised SystemExit: 5"),
    "a directory": (["report", "a_directory.pte"], "unknown model 'a_directory.pte' (a_directory.pte is a directory)"),
    "a .pt2 directory": (["report", "a_directory.pt2"], "a_directory.pt2 is a directory, not a program"),
    "-o .pte": (["lower", "models.py:block", "-o", ".pte"], "name the program before its .pte"),
    "a meta-device model": (["report", "models.py:on_meta"], "norm.weight is on device meta; edgefuse runs models on the CPU"),
    "stock .pte does not load": (["lower", "models.py:rank7", "-o", "rank7.pte"],
                                 "XNNPACK lowering (to_executorch) writes a program the runtime cannot load: "
                                 "RuntimeError: Failed to load method forward, error: 0x:1 (the runtime logged: "
                                 "Failed to define tensor 0 with code: xnn_status_unsupported_parameter;"),
    "bench: stock .pte does not load": (["bench", "models.py:rank7", "--runs", "10"], "the runtime cannot load"),
    "a program saved on the meta device": (["report", "meta.pt2"], "meta.pt2: weight is on device meta"),
    "lower a meta-device model": (["lower", "models.py:on_meta", "-o", "meta.pte"], "is on device meta"),
}
#: A model whose correct output holds -inf: matched infinities are no error, for every command.
MASKED = {
    "masked report": ["report", "models.py:masked"],
    "masked lower": ["lower", "models.py:masked", "-o", "masked.pte"],
    "masked bench": ["bench", "models.py:masked", "--runs", "10", "--warmup", "1"],
}
#: A model with an integer output, at both stages: it must match exactly, and does.
INTEGER_OUTPUT = {
    "edge": ["report", "models.py:integer_output"],
    "capture": ["report", "models.py:integer_output", "--stage", "capture"],
}


@pytest.fixture(scope="module")
def command_results(workdir) -> dict[str, dict]:
    """ONE_BY_ONE, BAD_INPUT, INTEGER_OUTPUT and MASKED, run in one process (run_commands), by case name."""
    (workdir / "corrupt.pt2").write_bytes(b"not a zip archive")
    (workdir / "syntax.py").write_text("def build(:\n")
    (workdir / "a_directory.pte").mkdir(exist_ok=True)
    (workdir / "a_directory.pt2").mkdir(exist_ok=True)
    (workdir / "exits.py").write_text("import sys\n\n\ndef leave():\n    sys.exit(0)\n")
    (workdir / "exits_on_import.py").write_text("import sys\n\nsys.exit(5)\n")
    with torch.device("meta"):
        meta, meta_input = torch.nn.Linear(4, 4), torch.randn(1, 4)
    torch.export.save(torch.export.export(meta, (meta_input,)), str(workdir / "meta.pt2"))
    if not (workdir / "models_link.svg").exists():
        os.link(workdir / "models.py", workdir / "models_link.svg")
    cases = {**ONE_BY_ONE, **{name: argv for name, (argv, _) in BAD_INPUT.items()}, **INTEGER_OUTPUT, **MASKED}
    return dict(zip(cases, run_commands(*cases.values(), cwd=workdir)))


def test_bad_input_exits_2_with_a_message_and_no_traceback(workdir, command_results):
    for case, (_, message) in BAD_INPUT.items():
        done = command_results[case]
        assert done["code"] == USAGE, (case, done)
        assert message in last_line(done["stderr"]), (case, done["stderr"])
        assert "Traceback" not in done["stderr"], (case, done["stderr"])
        assert done["stdout"] == "", (case, done["stdout"])
    assert not (workdir / "same.pte").exists() and not (workdir / "b.pte").exists()
    assert (workdir / "block.pt2").read_bytes()[:2] == b"PK" and (workdir / "models.py").read_text() == MODELS_PY
    assert "data-dependent" in command_results["data-dependent"]["stderr"]
    assert "symbolic_shapes" not in command_results["data-dependent"]["stderr"]  # torch's warnings about symbols
    assert "def forward" not in command_results["data-dependent"]["stderr"]  # torch's partial graph dump
    assert "SyntaxError: invalid syntax (syntax.py, line 1)" in command_results["syntax error"]["stderr"]
    assert "linalg_inv" in command_results["not in the edge opset"]["stderr"]
    for case in ("stock .pte does not load", "bench: stock .pte does not load"):  # the runtime's log: in the message
        stderr = command_results[case]["stderr"]
        assert "XNNCompiler" not in stderr.replace(last_line(stderr), ""), stderr
    assert "try --stage capture" in command_results["not in the edge opset"]["stderr"]
    assert not (workdir / "inv.pte").exists()


def test_an_integer_output_must_match_exactly(command_results):
    for case in INTEGER_OUTPUT:
        done = command_results[case]
        assert done["code"] == OK, (case, done)
        assert "Traceback" not in done["stderr"], (case, done["stderr"])
        assert "1 of 1 norms rebuilt" in done["stdout"] and ", within the allowed" in done["stdout"]


def test_an_output_masked_to_minus_infinity_matches_where_eager_has_it(command_results):
    for case in MASKED:
        done = command_results[case]
        assert done["code"] == OK, (case, done["stdout"], done["stderr"])
        assert "nan" not in done["stdout"] and "OUTSIDE" not in done["stdout"], (case, done["stdout"])
