"""A command says what it is about to do as it first imports torch or ExecuTorch, and says that a first run
takes a while when that import still runs a few seconds later
(:class:`edgefuse.console.progress.FirstHeavyImport`). The libraries here are stand-in modules whose
import the test holds, so no real time is asserted; the commands' own lines are tested in
tests/cli/test_cli_notices.py and tests/tools/test_tools_package.py."""

from __future__ import annotations

import sys
import threading

import pytest

from edgefuse.console.progress import SLOW_LOADING, FirstHeavyImport, asks_for_help


@pytest.fixture
def libraries(tmp_path, monkeypatch):
    """Two stand-in libraries: ``heavy_slow`` (its import waits until a line about slow loading is said,
    at most ten seconds) and ``heavy_fast``; and the lines said."""
    said: list[str] = []
    spoke = threading.Event()

    def say(line: str) -> None:
        said.append(line)
        if line == SLOW_LOADING:
            spoke.set()

    gate = type(sys)("heavy_gate")
    gate.wait = lambda: spoke.wait(10)
    monkeypatch.setitem(sys.modules, "heavy_gate", gate)
    (tmp_path / "heavy_slow.py").write_text("import heavy_gate\nheavy_gate.wait()\n")
    (tmp_path / "heavy_fast.py").write_text("")
    (tmp_path / "heavy_other.py").write_text("")
    (tmp_path / "light.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("heavy_slow", "heavy_fast", "heavy_other", "light"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return said, say


def test_the_line_is_said_as_the_first_heavy_import_starts_and_only_once(libraries):
    said, say = libraries
    with FirstHeavyImport(say, "report m.py:f: finding its norms", after=3600, libraries=("heavy_fast", "heavy_other")):
        import light  # noqa: F401
        assert said == []  # a light import says nothing: help and usage errors stop before any heavy one
        import heavy_fast  # noqa: F401
        import heavy_other  # noqa: F401
        assert said == ["report m.py:f: finding its norms; loading torch and ExecuTorch"]
    assert said == ["report m.py:f: finding its norms; loading torch and ExecuTorch"]


def test_a_slow_loading_is_said_to_take_a_while(libraries):
    said, say = libraries
    with FirstHeavyImport(say, "bench m.py:f", after=0.0, libraries=("heavy_slow",)):
        import heavy_slow  # noqa: F401  (held until the line about slow loading is said)
    assert said == ["bench m.py:f; loading torch and ExecuTorch", SLOW_LOADING]


def test_a_loading_is_slow_while_it_runs_and_not_once_it_has_ended(libraries, tmp_path, monkeypatch):
    said, say = libraries
    notice = FirstHeavyImport(say, "bench m.py:f", after=3600, libraries=("heavy_fast", "heavy_probe"))
    seen = type(sys)("heavy_seen")
    seen.notice = notice
    monkeypatch.setitem(sys.modules, "heavy_seen", seen)
    (tmp_path / "heavy_probe.py").write_text("import heavy_seen\nLOADING = heavy_seen.notice.still_loading()\n")
    monkeypatch.delitem(sys.modules, "heavy_probe", raising=False)
    assert not notice.still_loading()  # nothing imported yet
    with notice:
        import heavy_probe  # sets it off, and asks while its own code runs

        assert heavy_probe.LOADING
        assert not notice.still_loading()  # ended
    assert said == ["bench m.py:f; loading torch and ExecuTorch"]


def test_a_submodule_still_loading_after_its_package_has_loaded_is_slow_loading(libraries, tmp_path, monkeypatch):
    said, say = libraries
    notice = FirstHeavyImport(say, "bench m.py:f", after=3600, libraries=("heavy_pkg",), packages=("heavy_pkg",))
    seen = type(sys)("heavy_seen")
    seen.notice = notice
    monkeypatch.setitem(sys.modules, "heavy_seen", seen)
    (tmp_path / "heavy_pkg").mkdir()
    (tmp_path / "heavy_pkg" / "__init__.py").write_text("")
    (tmp_path / "heavy_pkg" / "sub.py").write_text("import heavy_seen\nLOADING = heavy_seen.notice.still_loading()\n")
    (tmp_path / "light_probe.py").write_text("import heavy_seen\nLOADING = heavy_seen.notice.still_loading()\n")
    for name in ("heavy_pkg", "heavy_pkg.sub", "light_probe"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with notice:
        import heavy_pkg  # sets it off, and has loaded

        assert not notice.still_loading()
        import heavy_pkg.sub  # asks while its own code runs, as transformers' submodules load after torch

        assert heavy_pkg.sub.LOADING
        import light_probe  # a module of no waited-for package is no loading of theirs

        assert not light_probe.LOADING


def test_a_loading_that_has_ended_when_the_seconds_are_up_is_said_nothing_about(libraries):
    said, say = libraries
    before = set(threading.enumerate())
    with FirstHeavyImport(say, "bench m.py:f", after=2.0, libraries=("heavy_fast",)):
        import heavy_fast  # noqa: F401  (an empty module: loaded long before two seconds are up)
    (timer,) = set(threading.enumerate()) - before
    timer.join()  # the check has run
    assert said == ["bench m.py:f; loading torch and ExecuTorch"]


def test_the_finder_is_gone_after_the_block_even_when_nothing_heavy_was_imported(libraries):
    said, say = libraries
    with FirstHeavyImport(say, "lower m.py:f", libraries=("heavy_fast",)) as notice:
        assert sys.meta_path[0] is notice
    assert notice not in sys.meta_path and said == []


def test_a_process_that_has_loaded_the_first_library_says_nothing(libraries):
    said, say = libraries
    import heavy_fast  # noqa: F401  (as torch is, in a notebook that has run a command before)

    with FirstHeavyImport(say, "bench m.py:f", libraries=("heavy_fast", "heavy_other")) as notice:
        import heavy_other  # noqa: F401  (a part not loaded yet, imported in the middle of the command)
    assert said == [] and notice not in sys.meta_path


def test_help_is_asked_for_with_either_spelling():
    assert asks_for_help(["--cases", "3", "-h"]) and asks_for_help(["--help"])
    assert not asks_for_help(["--cases", "3"]) and not asks_for_help([])
