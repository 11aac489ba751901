"""A reproducer imports edgefuse through its public names alone: every kind the fuzzer writes is parsed, each
name it takes from edgefuse checked against the public face, and one of each kind runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from edgefuse.fuzz import trust
from tests.public_names import public


def edgefuse_names(text: str) -> list[tuple[str, str]]:
    """(module, name) for each name a reproducer's text takes from edgefuse: ``from M import N``, and
    ``edgefuse.N`` after ``import edgefuse`` (``import edgefuse.a.b`` is the name ``b`` of ``edgefuse.a``)."""
    tree = ast.parse(text)
    names: list[tuple[str, str]] = []
    imported = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "edgefuse":
            names += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "edgefuse":
                    imported = True
                elif alias.name.startswith("edgefuse."):
                    module, _, name = alias.name.rpartition(".")
                    names.append((module, name))
    if imported:
        names += [("edgefuse", node.attr) for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "edgefuse"]
    return names


@pytest.fixture(scope="module")
def kinds() -> dict[str, str]:
    """One reproducer of each kind the fuzzer writes: a case, a batch, a damaged graph, the XNNPACK flow."""
    texts = trust.reproducer_texts(0, count=3)
    return {"case": texts[0], "batch": texts[-3], "hostile": texts[-2], "xnnpack": texts[-1]}


def test_every_kind_of_reproducer_takes_only_public_names_from_edgefuse(kinds):
    for kind, text in kinds.items():
        names = edgefuse_names(text)
        assert names, kind
        private = [f"{module}.{name}" for module, name in names if not public(module, name)]
        assert private == [], kind


def test_the_import_check_sees_a_private_name_in_each_way_it_can_be_imported():
    for text in ("from edgefuse.fuzz.tolerance import compare_at\n", "from edgefuse.runtime import LoadedProgram\n",
                 "import edgefuse.compare.pte_checks\n", "import edgefuse\nedgefuse.core\n",
                 "from edgefuse.fuzz import generate\n"):
        names = edgefuse_names(text)
        assert names and not all(public(module, name) for module, name in names), text
    assert all(public(m, n) for m, n in edgefuse_names("import edgefuse\nedgefuse.recompose_rms_norm\n"))


@pytest.mark.parametrize("kind", ["case", "batch", "hostile", pytest.param("xnnpack", marks=pytest.mark.slow)])
def test_each_kind_of_reproducer_runs_and_passes_on_a_case_without_a_bug(kind, kinds, tmp_path, capsys):
    path = tmp_path / f"{kind}.py"
    path.write_text(kinds[kind])
    namespace = {"__name__": "reproducer", "__file__": str(path)}
    exec(compile(kinds[kind], str(path), "exec"), namespace)
    assert namespace["main"]() == 0, capsys.readouterr().out
    assert "OK: the check passes" in capsys.readouterr().out


def test_a_reproducer_written_before_its_imports_were_public_still_replays(capsys):
    # The file imports edgefuse.fuzz.localize and edgefuse.fuzz.tolerance; --replay reads its SPEC alone.
    from edgefuse.fuzz import cli as fuzz_cli

    old = Path(__file__).parent / "data" / "reproducer_before_public_imports.py"
    assert not all(public(module, name) for module, name in edgefuse_names(old.read_text()))
    assert fuzz_cli.main(["--replay", str(old)]) == 0
    assert "checks, rebuilt" in capsys.readouterr().out
