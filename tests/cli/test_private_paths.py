"""Files edgefuse writes where it chooses: never through a symlink, never into a folder another user made
or can write. A planted folder and a planted symlink get nothing written through them."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile

import pytest

import edgefuse
from edgefuse.cli import demo
from edgefuse.cli.errors import OK
from edgefuse.runtime.files import UnsafeFolder, own_folder, write_text
from edgefuse.fuzz import cli as fuzz_cli

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


def test_the_demo_writes_nothing_through_a_planted_folder_or_symlink(planted):
    # The whole demo, as a user runs it, with TMPDIR where another user planted the old fixed folder.
    shared, folder, victim = planted
    done = subprocess.run(
        [sys.executable, "-m", "edgefuse", "-q", "demo"], cwd=shared, capture_output=True, text=True,
        timeout=900, env={**os.environ, "TMPDIR": str(shared)},
    )
    assert done.returncode == OK, done.stderr
    [path] = re.findall(r"delegate map \(open it in a browser\): (\S+)", done.stdout)
    assert os.path.dirname(os.path.dirname(path)) == str(shared) and not path.startswith(str(folder) + os.sep)
    assert os.path.isfile(path) and not os.path.islink(path)
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
