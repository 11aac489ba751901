"""``python -m edgefuse.tools.NAME``: each tool says what it is about to do before torch or ExecuTorch is
imported, a name that is no tool exits 2 with the list of those that are, and help says nothing. Each
command runs in a new process only until its first heavy import (:mod:`tests.first_import`)."""

from __future__ import annotations

import pkgutil

import pytest

import edgefuse.tools
from edgefuse.tools import TOOLS
from tests.first_import import until_first_heavy_import

pytestmark = pytest.mark.slow  # the tests start python -m edgefuse.tools in new processes

USAGE = 2


def test_the_table_names_every_tool_in_the_folder():
    assert set(TOOLS) == {info.name for info in pkgutil.iter_modules(edgefuse.tools.__path__)}


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_tool_says_what_it_does_before_torch_or_executorch_is_imported(name, tmp_path):
    ran = until_first_heavy_import(["-m", f"edgefuse.tools.{name}"], tmp_path)
    assert ran.importing is not None, ran.stderr
    assert len(ran.said) == 1, ran.stderr
    assert ran.said[0].endswith(f"] python -m edgefuse.tools.{name}: {TOOLS[name]}; loading torch and ExecuTorch")


@pytest.mark.parametrize("argv", [["-m", "edgefuse.tools.nope"], ["-m", "edgefuse.tools.nope", "--help"],
                                  ["-m", "edgefuse.tools"]])
def test_a_name_that_is_no_tool_exits_2_with_the_list_of_tools(argv, tmp_path):
    ran = until_first_heavy_import(argv, tmp_path)
    assert ran.code == USAGE and ran.importing is None, ran.stderr
    (line,) = ran.said
    assert line.startswith("python -m edgefuse.tools.NAME: ")
    assert ("no tool 'nope'" if len(argv[1]) > len("edgefuse.tools") else "give a tool") in line
    assert line.endswith("the tools are: " + ", ".join(sorted(TOOLS)))


def test_help_is_not_announced(tmp_path):
    ran = until_first_heavy_import(["-m", "edgefuse.tools.xnnpack_bench", "--help"], tmp_path)
    assert ran.said == [], ran.stderr


def test_a_tool_imported_by_other_code_is_not_announced(tmp_path):
    """Only the module named after ``-m`` is announced, even when the package was imported on the way to
    another one."""
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "__init__.py").write_text("import edgefuse.tools\n")
    (tmp_path / "probe" / "run.py").write_text("import edgefuse.tools.nope\n")
    ran = until_first_heavy_import(["-m", "probe.run"], tmp_path)
    assert ran.said[-1] == "ModuleNotFoundError: No module named 'edgefuse.tools.nope'", ran.stderr
