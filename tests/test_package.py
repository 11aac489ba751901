"""The package's shape: its layers hold (import-linter's contracts), only the application prints, the
README names every module, and the names people type after ``import edgefuse`` work."""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import edgefuse

PACKAGE = Path(edgefuse.__file__).parent
ROOT = Path(__file__).resolve().parents[1]

#: Where printing is the job: the application, and the fuzzer beside it (its command line, and the
#: progress its runner writes to the stream it is given).
PRINTS = ("cli", "fuzz")


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_the_import_contracts_hold():
    """``lint-imports`` checks the contracts in pyproject.toml on this tree; its report is the failure."""
    command = shutil.which("lint-imports")
    assert command is not None, "import-linter is not installed: pip install -e '.[test]'"
    done = subprocess.run(
        [command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)},
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout, done.stdout[-2000:]


def test_every_module_is_in_a_contract():
    """A module at the root is core and is checked as such; a package is forbidden to the core, and a
    package other than the application and the fuzzer is a backend, checked as one."""
    core, backends = _contracts()[:2]
    modules = {info.name: info.ispkg for info in pkgutil.iter_modules([str(PACKAGE)])}
    root_modules = {f"edgefuse.{n}" for n, pkg in modules.items() if not pkg and n != "__main__"}
    packages = {f"edgefuse.{n}" for n, pkg in modules.items() if pkg}
    assert set(core["source_modules"]) == root_modules
    assert set(core["forbidden_modules"]) == packages
    assert set(backends["source_modules"]) == packages - {"edgefuse.cli", "edgefuse.fuzz"}
    assert set(backends["forbidden_modules"]) == {"edgefuse.cli", "edgefuse.fuzz"}


def _prints(path: Path) -> list[int]:
    """The lines of ``path`` that call ``print`` or write to ``sys.stdout`` or ``sys.stderr``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        if isinstance(function, ast.Name) and function.id == "print":
            lines.append(node.lineno)
        elif (
            isinstance(function, ast.Attribute)
            and function.attr in ("write", "writelines")
            and isinstance(function.value, ast.Attribute)
            and function.value.attr in ("stdout", "stderr", "__stdout__", "__stderr__")
            and isinstance(function.value.value, ast.Name)
            and function.value.value.id == "sys"
        ):
            lines.append(node.lineno)
    return lines


def test_nothing_but_the_application_prints():
    """The core, the backends and the shared runtime return data or raise; the application prints."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in PRINTS
        for line in _prints(path)
    ]
    assert found == [], "printing outside the application: " + ", ".join(found)


def test_the_print_check_finds_a_print_and_a_write(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import sys\nprint('x')\nsys.stderr.write('y')\nsys.stdout.writelines(['z'])\nlog.write('fine')\n")
    assert _prints(module) == [2, 3, 4]


def test_the_readme_layout_table_names_every_module():
    readme = (ROOT / "README.md").read_text()
    table = [line for line in readme[readme.index("## Layout"):].splitlines() if line.startswith("|")]
    named = set(re.findall(r"`([\w/.]+\.py)`", "\n".join(table)))
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    assert modules - named == set(), f"modules the README's layout table leaves out: {sorted(modules - named)}"
    assert named - modules == set(), f"the layout table names modules that do not exist: {sorted(named - modules)}"


def test_the_names_people_type_work_after_import_edgefuse_without_importing_executorch():
    """``import edgefuse`` then ``edgefuse.passes``, ``edgefuse.xnnpack``, ``edgefuse.quant`` (and every
    other public submodule, ``edgefuse.qnn`` among them once it exists), in a fresh interpreter."""
    code = textwrap.dedent(
        """
        import json, pkgutil, sys
        import edgefuse
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] == "executorch")
        public = sorted(i.name for i in pkgutil.iter_modules(edgefuse.__path__) if not i.name.startswith("_"))
        kinds = {name: type(getattr(edgefuse, name)).__name__ for name in public}
        names = {
            "passes": [n for n in ("RecomposeRmsNorm", "RemoveRedundantCasts") if hasattr(edgefuse.passes, n)],
            "xnnpack": [n for n in ("lower", "EdgefuseXnnpackPartitioner") if hasattr(edgefuse.xnnpack, n)],
            "quant": [n for n in ("mark_norms", "norm_quantization") if hasattr(edgefuse.quant, n)],
        }
        try:
            edgefuse.no_such_name
            missing = "no error"
        except AttributeError as error:
            missing = str(error)
        print(json.dumps({"loaded": loaded, "kinds": kinds, "names": names, "missing": missing,
                          "dir": sorted(set(public) - set(dir(edgefuse)))}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert data["loaded"] == []
    assert {"passes", "xnnpack", "quant"} <= set(data["kinds"])
    assert set(data["kinds"].values()) == {"module"}, data["kinds"]
    assert data["names"] == {
        "passes": ["RecomposeRmsNorm", "RemoveRedundantCasts"],
        "xnnpack": ["lower", "EdgefuseXnnpackPartitioner"],
        "quant": ["mark_norms", "norm_quantization"],
    }
    assert data["missing"] == "module 'edgefuse' has no attribute 'no_such_name'"
    assert data["dir"] == []
