"""``--explorer``: refused before any slow work (a name it would write that exists, an output that is no
``.pte``, two outputs on one file, a QNN lowering, whose delegate has no subgraph to mark), and what
``lower --explorer`` writes (``report --explorer``: tests/compare/test_explorer.py)."""

from __future__ import annotations

import pytest

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


@pytest.mark.slow
def test_lower_writes_both_programs_with_overlays_that_say_where_edgefuse_put_each_mean(tmp_path, capsys):
    """``lower --explorer``: stock's program beside edgefuse's, an overlay beside each, the commands that open
    them; stock's overlay marks each norm's mean outside with where edgefuse's lowering put that mean."""
    import json

    from edgefuse.compare.explorer import NORM_OUTSIDE, open_command
    from tests.compare.test_explorer import MODEL_PY

    (tmp_path / "models.py").write_text(MODEL_PY)
    out = tmp_path / "two.pte"
    assert cli.main(["-q", "lower", f"{tmp_path / 'models.py'}:build", "-o", str(out), "--explorer"]) == 0
    printed = capsys.readouterr().out
    assert open_command(str(out)) in printed and open_command(str(tmp_path / "two.stock.pte")) in printed
    stock = json.loads((tmp_path / "two.stock.nodedata.json").read_text())["forward"]["results"]
    marked = sorted(r["value"] for r in stock.values() if r["bgColor"] == NORM_OUTSIDE)
    assert marked == [
        f"norm op outside: aten::mean.out of {norm}: ExecuTorch's XnnpackPartitioner left it outside "
        "(edgefuse: its mean kept in a delegate)" for norm in ("first", "second")
    ]
    ours = json.loads((tmp_path / "two.nodedata.json").read_text())["forward"]["results"]
    assert [r["value"] for r in ours.values()] == ["delegated (XnnpackBackend): holds ops of first, second"]
