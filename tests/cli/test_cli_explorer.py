"""``--explorer`` refused before any slow work: a name it would write that exists, an output that is no
``.pte``, two outputs on one file, and a QNN lowering (its delegate has no subgraph to mark)."""

from __future__ import annotations

from edgefuse import cli
from edgefuse.inputs.errors import USAGE


def _refused(argv: list[str], capsys) -> str:
    assert cli.main(["-q", *argv]) == USAGE
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.err


def test_lower_refuses_an_overlay_name_that_exists_and_leaves_it(tmp_path, capsys):
    taken = tmp_path / "out.stock.nodedata.json"
    taken.write_text("theirs")
    error = _refused(["lower", "tiny-llama", "-o", str(tmp_path / "out.pte"), "--explorer"], capsys)
    assert f"the stock's Model Explorer overlay's name {taken} exists and this run did not write it" in error
    assert taken.read_text() == "theirs"
    assert not (tmp_path / "out.pte").exists()


def test_lower_refuses_a_stock_program_name_that_exists(tmp_path, capsys):
    (tmp_path / "out.stock.pte").write_bytes(b"theirs")
    error = _refused(["lower", "tiny-llama", "-o", str(tmp_path / "out.pte"), "--explorer"], capsys)
    assert "the stock .pte's name" in error


def test_without_explorer_lower_does_not_look_at_the_overlay_names(tmp_path, capsys):
    """The names are checked for ``--explorer`` alone: without it a file there stops nothing (the run
    goes on to resolve MODEL, which fails here on a name no model has)."""
    (tmp_path / "out.stock.pte").write_bytes(b"theirs")
    error = _refused(["lower", "tiny-nope", "-o", str(tmp_path / "out.pte")], capsys)
    assert "unknown model 'tiny-nope'" in error


def test_report_explorer_names_a_pte(tmp_path, capsys):
    error = _refused(["report", "tiny-llama", "--explorer", str(tmp_path / "out.json")], capsys)
    assert "--explorer" in error and "must end in .pte" in error


def test_report_explorer_and_map_on_one_file_are_refused(tmp_path, capsys):
    same = str(tmp_path / "same.pte")
    error = _refused(["report", "tiny-llama", "--explorer", same, "--map", same], capsys)
    assert "would be written to" in error


def test_lower_for_qnn_takes_no_explorer(tmp_path, capsys):
    error = _refused(["lower", "tiny-llama", "--backend", "qnn", "-o", str(tmp_path / "out.pte"), "--explorer"], capsys)
    assert "--explorer marks XNNPACK programs" in error
