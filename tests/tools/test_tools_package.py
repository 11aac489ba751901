"""``python -m edgefuse.tools.NAME``: each tool says what it is about to do before torch or ExecuTorch is
imported, a name that is no tool exits 2 with the list of those that are, help says nothing, and each tool
parses its arguments before it imports either. Each command runs in a new process only until its first
heavy import (:mod:`tests.first_import`)."""

from __future__ import annotations

import pkgutil

import pytest

import edgefuse.tools
from edgefuse.tools import TOOLS
from tests.first_import import fresh_python, until_first_heavy_import

USAGE = 2


def test_the_table_names_every_tool_in_the_folder():
    assert set(TOOLS) == {info.name for info in pkgutil.iter_modules(edgefuse.tools.__path__)}


def test_every_tool_answers_help_and_a_bad_option_before_it_imports_torch_or_executorch():
    """Help and the parser's usage errors come at once, with no notice of loading torch and ExecuTorch:
    each tool parses its arguments before its first heavy import. One new interpreter, the tools in turn
    (the first one that imports torch is named; the later ones find it loaded)."""
    data = fresh_python(
        """
        import contextlib, importlib, io, json, sys
        from edgefuse.tools import TOOLS
        runs = {}
        for name in sorted(TOOLS):
            main = importlib.import_module(f"edgefuse.tools.{name}").main
            for argv in (["--help"], ["--no-such-option"]):
                with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
                    try:
                        code = main(argv)
                    except SystemExit as exit_:
                        code = exit_.code
                said = (out.getvalue() + err.getvalue()).splitlines()[:1]
                loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("executorch", "torch"))[:1]
                runs[f"{name} {argv[0]}"] = [code, said, loaded]
        print(json.dumps(runs))
        """
    )
    usage = {name: f"usage: python -m edgefuse.tools.{name}" for name in TOOLS}
    assert {run: (code, said[0][:len(usage[run.split()[0]])], loaded) for run, (code, said, loaded) in data.items()} == {
        f"{name} {option}": (code, usage[name], []) for name in sorted(TOOLS)
        for option, code in (("--help", 0), ("--no-such-option", USAGE))}


@pytest.mark.slow  # starts python -m edgefuse.tools in a new process
@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_tool_says_what_it_does_before_torch_or_executorch_is_imported(name, tmp_path):
    work = {"qnn_sweep": ["rank2", "--out", str(tmp_path)]}.get(name, [])  # the one tool with no default work
    ran = until_first_heavy_import(["-m", f"edgefuse.tools.{name}", *work], tmp_path)
    assert ran.importing is not None, ran.stderr
    assert len(ran.said) == 1, ran.stderr
    assert ran.said[0].endswith(f"] python -m edgefuse.tools.{name}: {TOOLS[name]}; loading torch and ExecuTorch")


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["-m", "edgefuse.tools.nope"], ["-m", "edgefuse.tools.nope", "--help"],
                                  ["-m", "edgefuse.tools"]])
def test_a_name_that_is_no_tool_exits_2_with_the_list_of_tools(argv, tmp_path):
    ran = until_first_heavy_import(argv, tmp_path)
    assert ran.code == USAGE and ran.importing is None, ran.stderr
    (line,) = ran.said
    assert line.startswith("python -m edgefuse.tools.NAME: ")
    assert ("no tool 'nope'" if len(argv[1]) > len("edgefuse.tools") else "give a tool") in line
    assert line.endswith("the tools are: " + ", ".join(sorted(TOOLS)))


@pytest.mark.slow
def test_help_is_not_announced(tmp_path):
    ran = until_first_heavy_import(["-m", "edgefuse.tools.xnnpack_bench", "--help"], tmp_path)
    assert ran.said == [], ran.stderr


@pytest.mark.slow
def test_a_tool_imported_by_other_code_is_not_announced(tmp_path):
    """Only the module named after ``-m`` is announced, even when the package was imported on the way to
    another one."""
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "__init__.py").write_text("import edgefuse.tools\n")
    (tmp_path / "probe" / "run.py").write_text("import edgefuse.tools.nope\n")
    ran = until_first_heavy_import(["-m", "probe.run"], tmp_path)
    assert ran.said[-1] == "ModuleNotFoundError: No module named 'edgefuse.tools.nope'", ran.stderr
