"""Reading what others hand the user: regular files only, within a bound, from one open file; writing a name
edgefuse chose: a new file, never through a link, never over a file it did not write in this run."""

from __future__ import annotations

import os
import threading

import pytest

from edgefuse.runtime.files import NotARegularFile, TooLarge, open_regular, read_regular, replace_atomically, write_new


def test_a_regular_file_within_the_bound_is_read_whole(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, 100, "a test file") == b"x" * 100


def test_a_bound_far_above_the_file_sets_no_memory_aside_for_it(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, 1 << 50, "a test file") == b"x" * 100  # a petabyte would not be allocated


@pytest.mark.parametrize("limit", [300, 150])
def test_a_file_that_grows_while_it_is_read_is_read_to_its_end_or_refused_past_the_bound(limit, tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 200)
    real = os.fstat

    def smaller(fd):  # the size the file had when it was opened: it has grown since
        status = list(real(fd))
        status[6] = 50
        return os.stat_result(status)

    monkeypatch.setattr(os, "fstat", smaller)
    if limit > 200:
        assert read_regular(path, limit, "a test file") == b"x" * 200
    else:
        with pytest.raises(TooLarge, match=f"{limit + 1} bytes, past the bound of {limit}"):
            read_regular(path, limit, "a test file")


def test_a_file_past_the_bound_is_refused_naming_the_bound_and_the_option(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 101)
    with pytest.raises(TooLarge, match=r"101 bytes, past the bound of 100; raise it with --max-bytes"):
        read_regular(path, 100, "a test file", "--max-bytes")


def test_a_fifo_is_refused_at_once_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = []
    reader = threading.Thread(target=lambda: done.append(_refusal(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=5)
    assert done == ["a FIFO"], "opening a FIFO blocked, or was not refused as one"


def _refusal(path) -> str:
    try:
        read_regular(path, 1 << 20, "a test file")
    except NotARegularFile as error:
        return "a FIFO" if "a FIFO" in str(error) else str(error)
    return "read"


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a character device"), ("/", "a folder")])
def test_devices_and_folders_are_refused_before_a_byte_is_read(path, kind):
    with pytest.raises(NotARegularFile, match=kind):
        read_regular(path, 1 << 20, "a test file")


def test_the_open_file_is_the_one_checked_whatever_is_put_at_the_name_later(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"checked")
    with open_regular(path, 100, "a test file") as f:
        os.replace(tmp_path / "f.bin", tmp_path / "moved")
        (tmp_path / "f.bin").write_bytes(b"swapped in")
        assert f.read() == b"checked"


def test_write_new_creates_a_file_and_may_write_it_again_in_the_same_run(tmp_path):
    path = tmp_path / "out.svg"
    write_new(path, "one")
    write_new(path, "two")
    assert path.read_text() == "two"


def test_write_new_never_writes_over_a_file_it_did_not_create(tmp_path):
    path = tmp_path / "out.svg"
    path.write_text("the user's own file")
    with pytest.raises(FileExistsError, match="did not write it in this run"):
        write_new(path, "edgefuse's map")
    assert path.read_text() == "the user's own file"


def test_write_new_never_writes_through_a_symlink_at_the_name(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's file")
    link = tmp_path / "out.svg"
    link.symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_new(link, "edgefuse's map")
    assert victim.read_text() == "the victim's file"
    dangling = tmp_path / "dangling.svg"
    dangling.symlink_to(tmp_path / "nowhere.txt")
    with pytest.raises(FileExistsError):
        write_new(dangling, "edgefuse's map")
    assert not (tmp_path / "nowhere.txt").exists()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "out.pte"
    target.write_bytes(b"old")

    def fail(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        replace_atomically(target, lambda f: f.write(b"new program"))
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.pte"]


def test_a_written_file_has_the_umask_permissions_of_a_plain_open(tmp_path):
    target = tmp_path / "out.pte"
    replace_atomically(target, lambda f: f.write(b"program"))
    umask = os.umask(0)
    os.umask(umask)
    assert target.read_bytes() == b"program"
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
