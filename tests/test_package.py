"""The package's shape: its layers hold (import-linter's contracts), only the application and the fuzzer
print, the README names every module, and the names people type after ``import edgefuse`` work."""

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

import pytest

import edgefuse

PACKAGE = Path(edgefuse.__file__).parent
ROOT = Path(__file__).resolve().parents[1]

#: Where printing is the job: the application, and the fuzzer beside it (its own command line, and the
#: progress its runner writes to the stream it is given). The README's layout section says the same.
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


#: The application and the fuzzer; every other package is a backend (the shared runtime among them).
TOP = {"edgefuse.cli", "edgefuse.fuzz"}
#: The modules that hand a documented ``python -m`` command over to the application, and the one import
#: each makes of it: the contracts ignore those edges alone, never the modules.
HAND_OVERS = {
    "edgefuse.__main__": {"edgefuse.cli"},
    "edgefuse.xnnpack.bench": {"edgefuse.cli.progress", "edgefuse.cli.xnnpack_bench"},
    "edgefuse.xnnpack.check_models": {"edgefuse.cli.progress", "edgefuse.cli.check_models"},
    "edgefuse.quant.__main__": {"edgefuse.cli.quant_command"},
}


def _layout() -> tuple[set[str], set[str]]:
    """The core's modules (the package root itself among them) and the package's packages."""
    modules = {info.name: info.ispkg for info in pkgutil.iter_modules([str(PACKAGE)])}
    core = {"edgefuse"} | {f"edgefuse.{n}" for n, pkg in modules.items() if not pkg}
    return core, {f"edgefuse.{n}" for n, pkg in modules.items() if pkg}


def test_every_module_is_in_a_contract():
    """The core is the package root (its own ``__init__`` and ``__main__`` too) and each module beside
    them, checked module by module; every package is forbidden to it, with all it holds. A package other
    than the application and the fuzzer is a backend, checked as one."""
    core, backends = _contracts()[:2]
    modules, packages = _layout()
    assert set(core["source_modules"]) == modules
    assert core["as_packages"] is False  # else "edgefuse" would be the whole package, skipped as overlapping
    assert set(core["forbidden_modules"]) == packages | {f"{p}.**" for p in packages}
    assert set(backends["source_modules"]) == packages - TOP
    assert set(backends["forbidden_modules"]) == TOP


def test_the_contracts_ignore_the_hand_overs_imports_of_the_application_and_nothing_else():
    """Each ignored import is one exact edge (no wildcard) from a hand-over module into the application."""
    ignored = {}
    for contract in _contracts():
        for edge in contract.get("ignore_imports", []):
            importer, imported = (part.strip() for part in edge.split("->"))
            assert "*" not in edge, f"{edge!r} ignores more than one import"
            ignored.setdefault(importer, set()).add(imported)
    assert ignored == HAND_OVERS


def test_a_wrong_import_of_the_root_a_core_module_or_a_hand_over_breaks_a_contract(tmp_path):
    """On a copy of the package with wrong imports added (the root's ``__init__`` importing the runtime, a
    core module one of the application's modules, and each hand-over a second module of the
    application), ``lint-imports`` fails and names every one of them."""
    command = shutil.which("lint-imports")
    assert command is not None, "import-linter is not installed: pip install -e '.[test]'"
    copy = tmp_path / "src" / "edgefuse"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    wrong = {
        "__init__.py": ("edgefuse", "edgefuse.runtime.log"),
        "casts.py": ("edgefuse.casts", "edgefuse.cli.errors"),
        "__main__.py": ("edgefuse.__main__", "edgefuse.cli.commands"),
        "xnnpack/bench.py": ("edgefuse.xnnpack.bench", "edgefuse.cli.commands"),
        "xnnpack/check_models.py": ("edgefuse.xnnpack.check_models", "edgefuse.cli.report"),
        "quant/__main__.py": ("edgefuse.quant.__main__", "edgefuse.cli.errors"),
    }
    for path, (_, imported) in wrong.items():
        with open(copy / path, "a") as module:
            module.write(f"\nimport {imported}\n")
    done = subprocess.run(
        [command, "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "src")},
    )
    assert done.returncode != 0, done.stdout[-3000:]
    missed = [f"{a} -> {b}" for a, b in wrong.values() if f"{a} -> {b} " not in done.stdout]
    assert missed == [], f"lint-imports let these through: {missed}\n{done.stdout[-4000:]}"


def _rank(module: str) -> int:
    """A module's layer, bottom to top: 0 the core, 1 a backend or the shared runtime, 2 the application
    or the fuzzer."""
    core, packages = _layout()
    if module in core:
        return 0
    package = ".".join(module.split(".")[:2])
    assert package in packages, f"{module} is in no layer"
    return 2 if package in TOP else 1


def _lazy_tables(text: str, filename: str = "<source>") -> list[dict[str, str]]:
    """The tables ``text`` hands to :func:`edgefuse.lazy.lazy_names` (public name -> the module that
    defines it): each a module-level dict of strings, passed by name, or the test cannot read it."""
    tree = ast.parse(text, filename)
    assigned = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    assigned[target.id] = node.value
    tables = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "lazy_names":
            argument = node.args[1] if len(node.args) > 1 else None
            value = assigned.get(argument.id) if isinstance(argument, ast.Name) else argument
            assert isinstance(value, ast.Dict), f"{filename}:{node.lineno}: a lazy table the test cannot read"
            tables.append(ast.literal_eval(value))
    return tables


def _lazy_names_upward(module: str, text: str) -> list[str]:
    """Each name of ``module``'s lazy tables that a lower layer would load from a higher one."""
    return [
        f"{module}.{name} -> {target}"
        for table in _lazy_tables(text, module)
        for name, target in table.items()
        if _rank(target) > _rank(module)
    ]


def _package_modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def test_no_lazy_name_loads_a_higher_layer():
    """import-linter sees no import that ``lazy_names`` makes by string, so its tables are read here: a
    core name never loads a backend, the application or the fuzzer, a backend's never the application or
    the fuzzer, and every name's module exists."""
    modules = _package_modules()
    owners = [m for m, path in modules.items() if _lazy_tables(path.read_text(), str(path))]
    assert {"edgefuse", "edgefuse.xnnpack", "edgefuse.quant", "edgefuse.fuzz"} <= set(owners), owners
    found = []
    for module in owners:
        text = modules[module].read_text()
        found += _lazy_names_upward(module, text)
        found += [f"{module}.{n} -> {t}: no such module" for table in _lazy_tables(text) for n, t in table.items()
                  if t not in modules]
    assert found == [], found


@pytest.mark.parametrize(
    ("module", "target", "wrong"),
    [
        ("edgefuse", "edgefuse.cli.commands", True),
        ("edgefuse", "edgefuse.xnnpack.lowering", True),
        ("edgefuse", "edgefuse.fuzz.spec", True),
        ("edgefuse.passes", "edgefuse.runtime", True),
        ("edgefuse.xnnpack", "edgefuse.cli.errors", True),
        ("edgefuse.quant", "edgefuse.fuzz.check", True),
        ("edgefuse", "edgefuse.recompose", False),
        ("edgefuse.xnnpack", "edgefuse.quant.facts", False),
        ("edgefuse.fuzz", "edgefuse.cli.errors", False),
    ],
)
def test_the_lazy_table_check_finds_a_name_that_loads_a_higher_layer(module, target, wrong):
    text = f"from edgefuse.lazy import lazy_names\n_PUBLIC: dict[str, str] = {{'x': {target!r}}}\n"
    text += "__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)\n"
    assert _lazy_names_upward(module, text) == ([f"{module}.x -> {target}"] if wrong else [])


#: What writes to the standard streams, besides the name ``print``: ``sys``'s streams, ``traceback``'s and
#: ``pprint``'s printing functions (their ``format_*`` and ``pformat`` return text, and are fine).
STREAMS = {"stdout", "stderr", "__stdout__", "__stderr__"}
PRINTING = {
    "sys": STREAMS | {"displayhook", "__displayhook__"},
    "builtins": {"print"},
    "traceback": {"print_exc", "print_exception", "print_stack", "print_tb", "print_last", "print_list"},
    "pprint": {"pprint", "pp"},
}
#: The file descriptors of stdout and stderr, which ``os.write`` / ``os.fdopen`` / ``open`` may be given.
STANDARD_FDS = (1, 2)


def _printing(text: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """Each place in ``text`` that prints or reaches the standard streams, as (line, what): any use of
    the name ``print`` (a call, ``p = print``, a default argument), ``print`` or a stream taken from
    ``builtins`` or ``sys`` under any name they are imported or assigned as (``from sys import stderr``,
    ``import sys as s; s.stdout``, ``getattr(sys, "stdout")``), ``traceback``'s and ``pprint``'s printing
    functions, and ``os.write`` / ``os.fdopen`` / ``open`` on file descriptor 1 or 2."""
    tree = ast.parse(text, filename)
    aliases: dict[str, str] = {"__builtins__": "builtins"}  # a local name -> the module it stands for
    os_names, write_names = {"os"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in PRINTING:
                    aliases[alias.asname or alias.name] = alias.name
                elif alias.name == "os":
                    os_names.add(alias.asname or "os")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            write_names |= {a.asname or a.name for a in node.names if a.name in ("write", "fdopen")}

    def module_of(expr: ast.expr) -> str | None:
        """The module of PRINTING that ``expr`` stands for: a name bound to it, or ``__import__("sys")``,
        ``importlib.import_module("sys")``."""
        if isinstance(expr, ast.Name):
            return aliases.get(expr.id)
        if isinstance(expr, ast.Call) and expr.args and isinstance(expr.args[0], ast.Constant):
            function = expr.func
            named = function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)
            if named in ("__import__", "import_module") and expr.args[0].value in PRINTING:
                return expr.args[0].value
        return None

    changed = True
    while changed:  # ``out = sys`` makes ``out`` another name of sys, and so on
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and (module := module_of(node.value)) is not None:
                for target in node.targets:
                    if isinstance(target, ast.Name) and aliases.get(target.id) != module:
                        aliases[target.id], changed = module, True

    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name) and node.id == "print":
            found.append((line, "print"))
        elif isinstance(node, ast.ImportFrom) and node.module in PRINTING:
            for alias in node.names:
                if alias.name == "*" or alias.name in PRINTING[node.module]:
                    found.append((line, f"from {node.module} import {alias.name}"))
        elif isinstance(node, ast.Attribute) and (module := module_of(node.value)) is not None:
            if node.attr in PRINTING[module]:
                found.append((line, f"{module}.{node.attr}"))
        elif isinstance(node, ast.Subscript) and (module := module_of(node.value)) is not None:
            key = node.slice
            if isinstance(key, ast.Constant) and key.value in PRINTING[module]:
                found.append((line, f"{module}[{key.value!r}]"))
        elif isinstance(node, ast.Call):
            function, args = node.func, node.args
            if (
                isinstance(function, ast.Name) and function.id in ("getattr", "vars")
                and len(args) >= 2 and (module := module_of(args[0])) is not None
                and isinstance(args[1], ast.Constant) and args[1].value in PRINTING[module]
            ):
                found.append((line, f"getattr({module}, {args[1].value!r})"))
            first = args[0] if args else None
            to_fd = isinstance(first, ast.Constant) and type(first.value) is int and first.value in STANDARD_FDS
            os_call = (
                isinstance(function, ast.Attribute) and function.attr in ("write", "fdopen")
                and isinstance(function.value, ast.Name) and function.value.id in os_names
            ) or (isinstance(function, ast.Name) and function.id in write_names)
            if to_fd and (os_call or (isinstance(function, ast.Name) and function.id == "open")):
                found.append((line, f"{ast.unparse(function)}({first.value}, ...)"))
    return sorted(set(found))


#: The one place outside the application that reaches a standard stream, and how: the runtime's log
#: stand-in (``runtime/log.py``) takes standard error's place while ExecuTorch's runtime is called and
#: passes on, at once, what the runtime itself writes there, minus its set-up lines. It prints nothing of
#: edgefuse's own; holding the runtime's lines back until the call returns would lose the last ones a
#: runtime writes before it aborts the process.
#: Each allowance is the reference found and the whole line of code that holds it.
FORWARDS = {
    "runtime/log.py": {("sys.stderr", "stream = make(sys.stderr if sys.stderr is not None else io.StringIO())")},
}


def _printing_in(path: Path) -> list[str]:
    """What :func:`_printing` finds in a module of the package, less what :data:`FORWARDS` allows it."""
    allowed = FORWARDS.get(str(path.relative_to(PACKAGE)), set())
    text = path.read_text()
    lines = text.splitlines()
    return [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for line, what in _printing(text, str(path))
        if (what, lines[line - 1].strip()) not in allowed
    ]


def test_nothing_but_the_application_and_the_fuzzer_prints():
    """The core, the backends and the shared runtime return data, log or raise; only the application
    and the fuzzer beside it print (:data:`PRINTS`), and the runtime's log stand-in passes the runtime's
    own lines on (:data:`FORWARDS`)."""
    checked = [path for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] not in PRINTS]
    assert len(checked) > 40 and PACKAGE / "recompose.py" in checked and PACKAGE / "xnnpack" / "inspect.py" in checked
    found = [entry for path in checked for entry in _printing_in(path)]
    assert found == [], "printing outside the application and the fuzzer: " + ", ".join(found)


def test_the_runtime_log_may_pass_the_runtimes_lines_on_and_nothing_more(tmp_path, monkeypatch):
    """The allowance is for the stream the stand-in replaces, in that module only: a print there, or a
    reference to ``sys.stderr`` on any other line or in any other module, is still found."""
    log = PACKAGE / "runtime" / "log.py"
    assert _printing(log.read_text()), "the stand-in no longer reaches sys.stderr: drop FORWARDS"
    copy = tmp_path / "edgefuse"
    (copy / "runtime").mkdir(parents=True)
    (copy / "runtime" / "log.py").write_text(log.read_text() + "\nprint('x')\nsys.stderr.write('y')\n")
    (copy / "inspect.py").write_text("import sys\nsys.stderr.write('x')\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    assert [e.split(": ", 1)[1] for e in _printing_in(copy / "runtime" / "log.py")] == ["print", "sys.stderr"]
    assert [e.split(": ", 1)[1] for e in _printing_in(copy / "inspect.py")] == ["sys.stderr"]


#: Ways to print or reach a standard stream, each with what the check must name.
EVASIONS = {
    "print('x')": "print",
    "p = print\np('x')": "print",
    "def f(say=print):\n    say('x')": "print",
    "from builtins import print as p": "from builtins import print",
    "import builtins\nbuiltins.print('x')": "builtins.print",
    "import builtins as b\nb.print('x')": "builtins.print",
    "getattr(__builtins__, 'print')('x')": "getattr(builtins, 'print')",
    "__builtins__['print']('x')": "builtins['print']",
    "import sys\nsys.stdout.write('x')": "sys.stdout",
    "import sys\nsys.stderr.writelines(['x'])": "sys.stderr",
    "import sys\nsys.__stdout__.write('x')": "sys.__stdout__",
    "import sys\nsys.__stderr__.flush()": "sys.__stderr__",
    "import sys as s\ns.stdout.write('x')": "sys.stdout",
    "import sys\nout = sys\nout.stderr.write('x')": "sys.stderr",
    "import sys\nlog(file=sys.stderr)": "sys.stderr",
    "from sys import stderr": "from sys import stderr",
    "from sys import stdout as o": "from sys import stdout",
    "from sys import *": "from sys import *",
    "getattr(__import__('sys'), 'stdout').write('x')": "getattr(sys, 'stdout')",
    "import importlib\nimportlib.import_module('sys').stderr.write('x')": "sys.stderr",
    "import traceback\ntraceback.print_exc()": "traceback.print_exc",
    "import traceback\ntraceback.print_stack()": "traceback.print_stack",
    "import traceback as tb\ntb.print_exception(e)": "traceback.print_exception",
    "from traceback import print_exc": "from traceback import print_exc",
    "import pprint\npprint.pprint({})": "pprint.pprint",
    "from pprint import pprint": "from pprint import pprint",
    "from pprint import pp as show": "from pprint import pp",
    "import os\nos.write(1, b'x')": "os.write(1, ...)",
    "import os\nos.write(2, b'x')": "os.write(2, ...)",
    "import os as o\no.write(1, b'x')": "o.write(1, ...)",
    "from os import write\nwrite(2, b'x')": "write(2, ...)",
    "import os\nos.fdopen(1, 'w')": "os.fdopen(1, ...)",
    "open(2, 'w').write('x')": "open(2, ...)",
}


@pytest.mark.parametrize("text", EVASIONS)
def test_the_print_check_catches_every_way_to_print(text):
    assert EVASIONS[text] in [what for _, what in _printing(text)]


def test_the_print_check_leaves_data_logging_and_other_objects_alone():
    """Text returned, a logger, a stream handed in, another object's ``print`` or ``stdout`` (a
    subprocess's), ``traceback.format_exc``, ``pprint.pformat`` and a write to another descriptor."""
    text = textwrap.dedent(
        """
        import logging, os, pprint, subprocess, sys, traceback
        logging.getLogger(__name__).warning("x")
        done = subprocess.run(["true"], capture_output=True, text=True)
        lines = done.stdout.splitlines() + done.stderr.splitlines()
        console.print("x")
        stream.write(traceback.format_exc() + pprint.pformat({}))
        os.write(fd, b"x")
        os.write(5, b"x")
        version = sys.version_info
        open(path, "w").write("x")
        """
    )
    assert _printing(text) == []


def test_the_readme_layout_table_names_every_module():
    readme = (ROOT / "README.md").read_text()
    table = [line for line in readme[readme.index("## Layout"):].splitlines() if line.startswith("|")]
    named = set(re.findall(r"`([\w/.]+\.py)`", "\n".join(table)))
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    assert modules - named == set(), f"modules the README's layout table leaves out: {sorted(modules - named)}"
    assert named - modules == set(), f"the layout table names modules that do not exist: {sorted(named - modules)}"


def test_the_shared_fx_helpers_import_without_executorch():
    """``edgefuse._fx`` (the ops outside a delegate among its helpers) serves the core, which must load
    without ExecuTorch: importing it imports none of it."""
    code = "import sys, edgefuse._fx; print(sorted(m for m in sys.modules if m.split('.')[0] == 'executorch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


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
