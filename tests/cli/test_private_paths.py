"""Files edgefuse writes where it chooses: never through a symlink, never into a folder another user made
or can write. A planted folder and a planted symlink get nothing written through them."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest

import edgefuse
from edgefuse import cli
from edgefuse.cli import demo
from edgefuse.inputs.errors import OK, USAGE
from edgefuse.runtime.files import UnsafeFolder, own_folder, write_text
from edgefuse.fuzz import cli as fuzz_cli
from tests.cli.command_runs import SVG

MAP_NAME = f"{demo.MODEL}-float16.delegates.svg"


@pytest.fixture
def planted(tmp_path):
    """A temporary directory where another user made the demo's old folder first, world-writable, with a
    symlink under the map's name to a file of the victim's."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's file\n")
    shared = tmp_path / "tmp"
    folder = shared / "edgefuse-demo"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o777)
    (folder / MAP_NAME).symlink_to(victim)
    return shared, folder, victim


def test_the_demo_map_goes_to_a_new_private_folder_not_the_planted_one(planted, monkeypatch):
    shared, folder, victim = planted
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    path = demo.map_path()
    directory = os.path.dirname(path)
    assert os.path.dirname(directory) == str(shared) and directory != str(folder)
    status = os.lstat(directory)
    assert stat.S_ISDIR(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o700
    assert status.st_uid == os.geteuid()
    write_text(path, "<svg/>\n")
    assert victim.read_text() == "the victim's file\n"
    assert sorted(os.listdir(folder)) == [MAP_NAME]
    assert demo.map_path() != path  # a new folder each time: nothing to plant in advance


def test_a_symlink_at_the_file_name_is_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("kept")
    link = tmp_path / "out.svg"
    link.symlink_to(victim)
    with pytest.raises(UnsafeFolder, match="is a symlink"):
        write_text(link, "written")
    assert victim.read_text() == "kept"


@pytest.mark.parametrize("kind", ["symlink", "file", "others-can-write", "other-user"])
def test_a_folder_that_is_not_the_users_own_is_refused(kind, tmp_path):
    path = tmp_path / "out"
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
        reason = "is a symlink"
    elif kind == "file":
        path.write_text("")
        reason = "is not a folder"
    elif kind == "others-can-write":
        path.mkdir()
        os.chmod(path, 0o777)
        reason = "can be written by other users"
    else:
        if os.geteuid() != 0:
            pytest.skip("making a folder owned by another user needs root: run the tests as root (as CI does)")
        path.mkdir()
        os.chown(path, 65534, 65534)
        reason = "belongs to another user"
    with pytest.raises(UnsafeFolder, match=reason):
        own_folder(path)


def test_a_missing_folder_is_made_private(tmp_path):
    made = own_folder(tmp_path / "new" / "deeper")
    assert stat.S_IMODE(os.stat(made).st_mode) & 0o077 == 0


def _failing_fuzz_run(argv: list[str], monkeypatch) -> int:
    def broken(*args, **kwargs):
        raise RuntimeError("injected: the case fails and would get a reproducer")

    monkeypatch.setattr(edgefuse, "recompose_rms_norm", broken)
    return fuzz_cli.main(["--cases", "1", "--start", "1", "--seed", "11", "--edge-every", "1000", "--shrink", "0",
                          "-q", *argv])


def test_the_fuzzer_refuses_a_planted_default_reproducer_folder(tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "edgefuse-fuzz-failures").symlink_to(elsewhere)
    monkeypatch.chdir(work)
    assert _failing_fuzz_run([], monkeypatch) == 2
    assert "is a symlink" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


def test_the_fuzzer_refuses_a_reproducer_folder_others_can_write(tmp_path, monkeypatch, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert _failing_fuzz_run(["--out", str(shared)], monkeypatch) == 2
    assert "can be written by other users" in capsys.readouterr().err
    assert list(shared.iterdir()) == []


def test_the_fuzzer_writes_reproducers_into_a_private_folder_it_makes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert _failing_fuzz_run([], monkeypatch) == 1
    folder = tmp_path / "edgefuse-fuzz-failures"
    assert list(folder.glob("*.py")) and stat.S_IMODE(os.stat(folder).st_mode) & 0o077 == 0


@pytest.mark.slow
def test_the_demo_prints_its_tables_and_map_and_writes_nothing_through_a_planted_folder_or_symlink(planted):
    """The whole demo, as a user runs it, with TMPDIR where another user planted the old fixed folder: both
    tables, fewer delegates with edgefuse and a map in a new private folder, and nothing written through the
    planted folder or its symlink."""
    shared, folder, victim = planted
    done = subprocess.run(
        [sys.executable, "-m", "edgefuse", "-q", "demo"], cwd=shared, capture_output=True, text=True,
        timeout=900, env={**os.environ, "TMPDIR": str(shared)},
    )
    assert done.returncode == OK, done.stderr
    out = done.stdout
    for dtype in ("float32", "float16"):
        assert f"tiny-qwen3 ({dtype}), capture stage, backend qnn: 5 norms" in out
    summaries = [line for line in out.splitlines() if " norms rebuilt, " in line]
    assert len(summaries) == 2 and all(", within the allowed" in line for line in summaries), summaries
    assert out.count("model.model.layers.0.self_attn.q_norm") == 2  # a row in each table
    [counts] = re.findall(r"delegates: (\d+) stock -> (\d+) edgefuse", out)
    assert int(counts[1]) < int(counts[0]), counts
    [path] = re.findall(r"delegate map \(open it in a browser\): (\S+)", out)
    assert os.path.dirname(os.path.dirname(path)) == str(shared) and not path.startswith(str(folder) + os.sep)
    assert os.path.isfile(path) and not os.path.islink(path) and path.endswith(".svg")
    assert ET.parse(path).getroot().tag == f"{SVG}svg"
    assert victim.read_text() == "the victim's file\n" and sorted(os.listdir(folder)) == [MAP_NAME]


def _foreign(path, mode: int) -> None:
    """Make ``path`` a folder of uid 65534 ('nobody') with ``mode``: planted by another user."""
    try:
        os.chown(path, 65534, 65534)
    except PermissionError:
        pytest.skip("planting a folder of another user needs chown: run as root, e.g. "
                    "`sudo PYTHONPATH=$PWD/src python -m pytest -n 0 tests/cli/test_private_paths.py`")
    os.chmod(path, mode)


def test_a_symlinked_parent_into_another_users_writable_folder_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    _foreign(theirs, 0o777)
    (tmp_path / "link").symlink_to(theirs)
    with pytest.raises(UnsafeFolder, match="theirs belongs to another user"):
        own_folder(tmp_path / "link" / "out")
    with pytest.raises(UnsafeFolder, match="link is a symlink"):
        write_text(tmp_path / "link" / "out.svg", "written")
    assert list(theirs.iterdir()) == []  # nothing made or written in it


def test_a_folder_inside_another_users_folder_is_refused(tmp_path):
    # Its owner could swap the folder for a symlink once it is checked.
    other = tmp_path / "other"
    (other / "f2").mkdir(parents=True)
    _foreign(other, 0o755)
    with pytest.raises(UnsafeFolder, match="other belongs to another user"):
        own_folder(other / "f2")


def test_a_folder_swapped_for_a_symlink_after_the_check_is_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    folder = tmp_path / "mine" / "f2"
    own_folder(folder)
    os.rmdir(folder)
    folder.symlink_to(victim)  # swapped between the check and the write
    with pytest.raises(UnsafeFolder, match="is a symlink"):
        write_text(folder / "case.py", "written")
    assert list(victim.iterdir()) == []


def test_a_group_writable_folder_is_refused(tmp_path):
    path = tmp_path / "out"
    path.mkdir()
    os.chmod(path, 0o770)
    with pytest.raises(UnsafeFolder, match="can be written by other users"):
        own_folder(path)
    with pytest.raises(UnsafeFolder, match="can be written by other users"):
        write_text(path / "case.py", "written")
    assert list(path.iterdir()) == []


def test_a_parent_others_can_write_without_the_sticky_bit_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafeFolder, match="shared can be written by other users, who could swap"):
        own_folder(shared / "mine")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # as /tmp: others cannot rename what is not theirs
    assert own_folder(sticky / "mine") == str(sticky / "mine")


# --- files edgefuse names itself beside the user's: only new files -----------------------------------------

@pytest.fixture
def lower_run(tmp_path, monkeypatch):
    """``edgefuse lower`` of a small block into ``tmp_path/out.pte``; ``during`` (if given) runs when the
    first lowering starts, after the command checked its paths."""
    from edgefuse.compare import pte_checks
    from tests.cli.command_runs import MODELS_PY

    (tmp_path / "models.py").write_text(MODELS_PY)
    lowered = pte_checks.lower_to_pte

    def run(during=None) -> int:
        def lower_to_pte(*args, **kwargs):
            if during is not None:
                during()
            return lowered(*args, **kwargs)

        monkeypatch.setattr(pte_checks, "lower_to_pte", lower_to_pte)
        return cli.main(["-q", "lower", f"{tmp_path / 'models.py'}:block", "-o", str(tmp_path / "out.pte")])

    return run


def _refuse_lowering():
    raise AssertionError("lowered although the default map's name was taken")


def _take(name, kind: str):
    """Put a symlink to a victim's file, or a file of the user's, at ``name``; returns a check that both
    are as they were."""
    victim = name.parent / "victim.txt"
    victim.write_text("the victim's file\n")
    if kind == "symlink":
        name.symlink_to(victim)
    else:
        name.write_text("the user's own file\n")

    def untouched() -> bool:
        kept = name.is_symlink() if kind == "symlink" else name.read_text() == "the user's own file\n"
        return kept and victim.read_text() == "the victim's file\n"

    return untouched


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_lower_refuses_a_taken_default_map_name_before_lowering(kind, lower_run, tmp_path, capsys):
    """A symlink (to a file of the victim's) or a file at ``OUT.delegates.svg``: exit 2 before the slow
    work, saying what to do; the file and what the link leads to are unchanged, nothing is written."""
    default = tmp_path / "out.delegates.svg"
    untouched = _take(default, kind)
    assert lower_run(during=_refuse_lowering) == USAGE
    err = capsys.readouterr().err
    assert f"{default} exists (a {kind}) and this run did not write it" in err and "--map PATH" in err
    assert untouched() and not (tmp_path / "out.pte").exists()


@pytest.mark.slow
def test_a_link_planted_at_the_default_map_name_while_lowering_is_not_written_through(lower_run, tmp_path, capsys):
    """The name checked free before lowering and taken by a link while it runs: the map is not written
    through the link (exit 2 saying so), the link's target is unchanged."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's file\n")
    default = tmp_path / "out.delegates.svg"

    def plant():
        if not default.is_symlink():
            default.symlink_to(victim)

    assert lower_run(during=plant) == USAGE
    assert "exists (a symlink) and this run did not write it" in capsys.readouterr().err
    assert victim.read_text() == "the victim's file\n" and default.is_symlink()


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_export_llm_compare_keeps_stocks_program_only_as_a_new_file(kind, tmp_path, monkeypatch, capsys):
    """``--compare`` keeps stock's program as ``NAME.stock.pte`` beside the output: a symlink or a file
    already there is left as it is (exit 2 saying what to do), never written through or over."""
    from edgefuse.cli import llm_commands

    output = tmp_path / "model.pte"

    def export(passed, lowering, single_row, hydra_dir=None):  # stands in for export_llm: writes where told
        path = passed[-1].partition("=")[2] if lowering == "stock" else str(output)
        with open(path, "wb") as f:
            f.write(f"{lowering} program".encode())
        return SimpleNamespace(path=path)

    monkeypatch.setattr(llm_commands, "_run", export)
    kept = tmp_path / "model.stock.pte"
    untouched = _take(kept, kind)
    assert cli.main(["-q", "export-llm", "--compare", f"export.output_name={output}"]) == USAGE
    err = capsys.readouterr().err
    assert f"{kept} " in err and "choose another export.output_name" in err and "Traceback" not in err
    assert untouched()


def test_the_fuzzer_writes_a_reproducer_of_an_earlier_run_under_a_new_name(tmp_path, monkeypatch):
    """A reproducer name an earlier run took is left as it is: the new reproducer gets ``-2``."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert _failing_fuzz_run(["--out", str(first)], monkeypatch) == 1
    names = sorted(p.name for p in first.iterdir())
    second.mkdir(mode=0o700)
    for name in names:
        (second / name).write_text("# an earlier run's reproducer\n")
    assert _failing_fuzz_run(["--out", str(second)], monkeypatch) == 1
    for name in names:
        assert (second / name).read_text() == "# an earlier run's reproducer\n"
        renamed = second / name.replace(".py", "-2.py")
        assert renamed.read_text() == (first / name).read_text()
