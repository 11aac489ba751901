"""A reproducer rebuilds its case without the generator, fails while the bug is there, keeps what the case
holds (non-finite eps, the damage to a graph by node name), and imports edgefuse through its public names
alone: every kind the fuzzer writes is parsed, each name it takes from edgefuse checked against the public
face, and one of each kind runs."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch
from torch.export import export

import edgefuse.core.match
from edgefuse.fuzz import trust
from edgefuse.fuzz.check import Finding
from edgefuse.fuzz.render import build
from edgefuse.fuzz.reproducer import read_specs, reproducer_text
from edgefuse.fuzz.spec import CastSpec
from tests.fuzz.cases import LLAMA, first_case
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
    assert _run_reproducer(kinds[kind], tmp_path, f"{kind}.py") == 0, capsys.readouterr().out
    assert "OK: the check passes" in capsys.readouterr().out


def test_a_reproducer_written_before_its_imports_were_public_still_replays(capsys):
    # The file imports edgefuse.fuzz.localize and edgefuse.fuzz.tolerance; --replay reads its SPEC alone.
    from edgefuse.fuzz import cli as fuzz_cli

    old = Path(__file__).parent / "data" / "reproducer_before_public_imports.py"
    assert not all(public(module, name) for module, name in edgefuse_names(old.read_text()))
    assert fuzz_cli.main(["--replay", str(old)]) == 0
    assert "checks, rebuilt" in capsys.readouterr().out


def _run_reproducer(text: str, tmp_path, name: str) -> int:
    path = tmp_path / name
    path.write_text(text)
    namespace = {"__name__": "reproducer", "__file__": str(path)}
    exec(compile(text, str(path), "exec"), namespace)
    return namespace["main"]()


def test_a_reproducer_rebuilds_the_case_without_the_generator(tmp_path, capsys):
    spec = first_case(lambda s: s.near_miss is None and s.feed is not None and s.norm.weight is not None)
    finding = Finding("mismatch", ("capture", "qnn", True), "(no bug: a test of the file format)", spec)
    text = reproducer_text(finding)
    assert "edgefuse.fuzz.generate" not in text and "edgefuse.fuzz.render" not in text
    assert _run_reproducer(text, tmp_path, "repro.py") == 0
    assert "OK: the check passes" in capsys.readouterr().out
    assert read_specs(tmp_path / "repro.py") == [spec]


def test_a_reproducer_fails_while_the_bug_is_there(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(edgefuse.core.match, "at_least", lambda dtype, floor: True)
    rounding = dataclasses.replace(LLAMA, norm=dataclasses.replace(LLAMA.norm, mid=(CastSpec("to", "bfloat16"), CastSpec("to", "input"))))
    finding = Finding("norm-mismatch", ("capture", "aten", False), "(a dropped rounding)", rounding)
    assert _run_reproducer(reproducer_text(finding), tmp_path, "repro.py") == 1
    assert "FAIL: the rebuilt" in capsys.readouterr().out


def test_a_reproducer_keeps_nan_and_inf_eps(tmp_path):
    spec = first_case(lambda s: s.near_miss == "bad-eps" and s.norm.eps != s.norm.eps)
    path = tmp_path / "nan.py"
    path.write_text(reproducer_text(Finding("exception", ("capture", "aten", False), "x", spec)))
    [back] = read_specs(path)
    assert back.norm.eps != back.norm.eps and dataclasses.replace(back, norm=spec.norm) == spec


def test_a_hostile_reproducer_replays_the_damage_by_node_name(tmp_path, capsys):
    built = build([LLAMA])
    graph = export(built.module, built.inputs).module().graph
    names = [n.name for n in graph.nodes if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)]
    damage = (("opaque-after", names[0]), ("strip", names[1]), ("strip", names[-1]))
    finding = Finding("hostile-mismatch", ("unknown-op", "qnn", False), "(no bug: a test of the format)", LLAMA, damage=damage)
    text = reproducer_text(finding)
    assert f"DAMAGE = {list(damage)!r}" in text and "def apply_damage" in text
    assert _run_reproducer(text, tmp_path, "hostile.py") == 0
    assert "OK: the check passes" in capsys.readouterr().out
    assert read_specs(tmp_path / "hostile.py") == [LLAMA]


def test_an_xnnpack_reproducer_is_python_that_lowers_with_edgefuse():
    text = reproducer_text(Finding("xnnpack-mismatch", ("xnnpack", "edgefuse", False), "(format)", LLAMA))
    compile(text, "xnnpack.py", "exec")
    assert "lower(detached(program))" in text and "Runtime.get().load_program" in text
