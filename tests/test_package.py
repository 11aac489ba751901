"""The package's shape: its layers hold (import-linter's contracts), only the application and the fuzzer
print, docs/architecture.md names every module, and the names people type after ``import edgefuse`` work."""

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
from pathlib import Path

import pytest

import edgefuse
from tests.project import pyproject

PACKAGE = Path(edgefuse.__file__).parent
ROOT = Path(__file__).resolve().parents[1]

#: Where printing is the job: the application (its command line, its tools, and what it writes: progress
#: lines and tables), and the fuzzer beside it. docs/architecture.md says the same.
PRINTS = ("cli", "tools", "console", "fuzz")
#: The modules at the package root: its public face, above every layer.
PUBLIC_FACE = {"__init__.py", "__main__.py", "passes.py", "programs.py"}


def _layers() -> list[list[str]]:
    """The layers of the one contract, top to bottom, each the packages in it (``a | b``: siblings that do
    not import each other)."""
    [contract] = pyproject()["tool"]["importlinter"]["contracts"]
    assert contract["type"] == "layers" and contract["containers"] == ["edgefuse"], contract
    return [[f"edgefuse.{name.strip()}" for name in layer.split("|")] for layer in contract["layers"]]


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    command = shutil.which("lint-imports")
    assert command is not None, "import-linter is not installed: pip install -e '.[test]'"
    return subprocess.run(
        [command, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
    )


def test_the_import_contracts_hold():
    """``lint-imports`` checks the layers in pyproject.toml on this tree; its report is the failure."""
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout, done.stdout[-2000:]


def test_every_package_is_a_layer_and_the_root_holds_the_public_face_alone():
    """One folder per layer: each package of edgefuse is in the contract once, and the modules at the root
    are the public face (``edgefuse.passes``, ``edgefuse.programs``, the package's ``__init__`` and
    ``__main__``), which stands above the layers and which the contract does not check."""
    layered = [package for layer in _layers() for package in layer]
    assert len(layered) == len(set(layered)), layered
    packages = {f"edgefuse.{i.name}" for i in pkgutil.iter_modules([str(PACKAGE)]) if i.ispkg}
    assert set(layered) == packages
    assert {path.name for path in PACKAGE.glob("*.py")} == PUBLIC_FACE


#: An upward import from a module of each layer (and across siblings), added to a copy of the package:
#: each must break the contract, named by importer and imported.
UPWARD = {
    "core/casts.py": "edgefuse.runtime.files",
    "runtime/files.py": "edgefuse.quant.facts",
    "quant/facts.py": "edgefuse.xnnpack.policy",
    "xnnpack/policy.py": "edgefuse.qnn.socs",
    "qnn/socs.py": "edgefuse.llm.config",
    "llm/config.py": "edgefuse.inputs.errors",
    "hf/options.py": "edgefuse.llm.pte",
    "inputs/errors.py": "edgefuse.console.tables",
    "console/tables.py": "edgefuse.compare.delegate_map",
    "compare/delegate_map.py": "edgefuse.fuzz.spec",
    "fuzz/spec.py": "edgefuse.tools.pass_time",
    "tools/pass_time.py": "edgefuse.cli.commands",
}


def test_an_upward_import_breaks_the_contract(tmp_path):
    """On a copy of the package with one upward (or sibling) import added to a module of every layer,
    ``lint-imports`` fails and names each of them."""
    copy = tmp_path / "src" / "edgefuse"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, imported in UPWARD.items():
        with open(copy / path, "a") as module:
            module.write(f"\nimport {imported}\n")
    done = _lint_imports(tmp_path)
    assert done.returncode != 0, done.stdout[-3000:]
    importers = {path: "edgefuse." + path.removesuffix(".py").replace("/", ".") for path in UPWARD}
    missed = [f"{importers[p]} -> {m}" for p, m in UPWARD.items() if f"{importers[p]} -> {m} " not in done.stdout]
    assert missed == [], f"lint-imports let these through: {missed}\n{done.stdout[-4000:]}"


def _rank(module: str) -> int:
    """A module's layer, counted from the bottom (0: the core); the public face is above them all."""
    layers = _layers()
    package = ".".join(module.split(".")[:2])
    for height, layer in enumerate(reversed(layers)):
        if package in layer:
            return height
    assert module.count(".") <= 1, f"{module} is in no layer"
    return len(layers)  # the root and its public modules


def _lazy_tables(text: str, filename: str = "<source>") -> list[dict[str, str]]:
    """The tables ``text`` hands to :func:`edgefuse.core.lazy.lazy_names` (public name -> the module that
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
    """import-linter sees no import that ``lazy_names`` makes by string, so its tables are read here: no
    package's name loads a module of a layer above it (the public face may load any), and every name's
    module exists."""
    modules = _package_modules()
    owners = [m for m, path in modules.items() if _lazy_tables(path.read_text(), str(path))]
    assert {"edgefuse", "edgefuse.xnnpack", "edgefuse.quant", "edgefuse.fuzz", "edgefuse.llm"} <= set(owners), owners
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
        ("edgefuse.core.passes", "edgefuse.runtime", True),
        ("edgefuse.xnnpack", "edgefuse.inputs.errors", True),
        ("edgefuse.quant", "edgefuse.xnnpack.lowering", True),
        ("edgefuse.quant", "edgefuse.fuzz.check", True),
        ("edgefuse.llm", "edgefuse.compare.report", True),
        ("edgefuse", "edgefuse.core.recompose", False),
        ("edgefuse.xnnpack", "edgefuse.quant.facts", False),
        ("edgefuse.llm", "edgefuse.xnnpack.recipes", False),
        ("edgefuse.fuzz", "edgefuse.inputs.errors", False),
    ],
)
def test_the_lazy_table_check_finds_a_name_that_loads_a_higher_layer(module, target, wrong):
    text = f"from edgefuse.core.lazy import lazy_names\n_PUBLIC: dict[str, str] = {{'x': {target!r}}}\n"
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
#: runtime writes before it aborts the process. The same module flushes both streams (and writes nothing)
#: before a fork or before native code takes their descriptors over.
#: Each allowance is the reference found and the whole line of code that holds it.
FORWARDS = {
    "runtime/log.py": {
        ("sys.stderr", "stream = make(sys.stderr if sys.stderr is not None else io.StringIO())"),
        # flushing what Python holds buffered, before a fork or before native code takes the descriptors
        ("sys.stdout", "for stream in (sys.stdout, sys.stderr):"),
        ("sys.stderr", "for stream in (sys.stdout, sys.stderr):"),
    },
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
    """The core, the runtime, the backends, the LLM flows and the application's libraries (``inputs``,
    ``compare``) return data, log or raise; only the application and the fuzzer beside it print
    (:data:`PRINTS`), and the runtime's log stand-in passes the runtime's own lines on (:data:`FORWARDS`)."""
    checked = [path for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] not in PRINTS]
    assert len(checked) > 40 and PACKAGE / "core/recompose.py" in checked and PACKAGE / "xnnpack" / "inspect.py" in checked
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


def test_the_architecture_table_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = [line for line in text[text.index("## Modules"):].splitlines() if line.startswith("|")]
    named = set(re.findall(r"`([\w/.]+\.py)`", "\n".join(table)))
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    assert modules - named == set(), f"modules the architecture table leaves out: {sorted(modules - named)}"
    assert named - modules == set(), f"the layout table names modules that do not exist: {sorted(named - modules)}"


def test_the_names_people_type_work_after_import_edgefuse_without_importing_executorch():
    """``import edgefuse`` then ``edgefuse.passes``, ``edgefuse.xnnpack``, ``edgefuse.quant`` (and every
    other public submodule, ``edgefuse.qnn`` among them once it exists), in a fresh interpreter. Before the
    names, ``edgefuse.core._fx`` (the ops outside a delegate among its helpers) serves the core, which must
    load without ExecuTorch: importing it imports none of it either."""
    code = textwrap.dedent(
        """
        import json, pkgutil, sys
        import edgefuse
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] == "executorch")
        import edgefuse.core._fx
        fx_loaded = sorted(m for m in sys.modules if m.partition(".")[0] == "executorch")
        public = sorted(i.name for i in pkgutil.iter_modules(edgefuse.__path__) if not i.name.startswith("_"))
        kinds = {name: type(getattr(edgefuse, name)).__name__ for name in public}
        names = {
            "root": [n for n in ("recompose_rms_norm", "remove_redundant_casts", "edge_compile_config", "Decision",
                                 "RecomposeResult", "get_profile", "PROFILES") if hasattr(edgefuse, n)],
            "passes": [n for n in ("RecomposeRmsNorm", "RemoveRedundantCasts") if hasattr(edgefuse.passes, n)],
            "programs": [n for n in ("detached",) if hasattr(edgefuse.programs, n)],
            "xnnpack": [n for n in ("lower", "EdgefuseXnnpackPartitioner") if hasattr(edgefuse.xnnpack, n)],
            "quant": [n for n in ("mark_norms", "norm_quantization") if hasattr(edgefuse.quant, n)],
        }
        try:
            edgefuse.no_such_name
            missing = "no error"
        except AttributeError as error:
            missing = str(error)
        print(json.dumps({"loaded": loaded, "fx_loaded": fx_loaded, "kinds": kinds, "names": names,
                          "missing": missing, "dir": sorted(set(public) - set(dir(edgefuse))),
                          "all": {name: getattr(edgefuse, name) is not None for name in edgefuse.__all__},
                          "public": edgefuse.recompose_rms_norm.__module__,
                          "config": type(edgefuse.edge_compile_config()).__name__}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert data["loaded"] == [] and data["fx_loaded"] == []
    assert {"passes", "xnnpack", "quant"} <= set(data["kinds"])
    assert set(data["kinds"].values()) == {"module"}, data["kinds"]
    assert data["names"] == {
        "root": ["recompose_rms_norm", "remove_redundant_casts", "edge_compile_config", "Decision",
                 "RecomposeResult", "get_profile", "PROFILES"],
        "passes": ["RecomposeRmsNorm", "RemoveRedundantCasts"],
        "programs": ["detached"],
        "xnnpack": ["lower", "EdgefuseXnnpackPartitioner"],
        "quant": ["mark_norms", "norm_quantization"],
    }
    assert data["missing"] == "module 'edgefuse' has no attribute 'no_such_name'"
    assert data["dir"] == []
    assert set(data["all"]) >= {"recompose_rms_norm", "edge_compile_config", "Decision", "PROFILES"}
    assert all(data["all"].values())
    assert data["public"] == "edgefuse.core.recompose" and data["config"] == "EdgeCompileConfig"


def test_each_entry_point_of_the_slow_tier_fails_a_test_without_the_slow_marker():
    """The fast tier (``-m "not slow"``) holds what the ``slow`` marker says: while a test without it runs
    (this one), lowering, making a ``.pte``, loading one in the runtime and starting the edgefuse command
    each raise `SlowCall` before they do anything, and are recorded for tests/conftest.py to fail the test;
    a new Python process that is not the command is no slow call."""
    from executorch.exir.backend import backend_api
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    from executorch.exir.program._program import EdgeProgramManager
    from executorch.runtime import Runtime

    from tests.conftest import SLOW_CALLS, SlowCall

    calls = [
        lambda: backend_api._partition_and_lower(None, None, None),
        lambda: backend_api.lower_all_submodules_to_backend("XnnpackBackend", {}, {}),
        lambda: LoweredBackendModule(None, "XnnpackBackend", b"", []),
        lambda: EdgeProgramManager.to_executorch(None),
        lambda: Runtime.get().load_program(b""),
        lambda: subprocess.run([sys.executable, "-m", "edgefuse", "--help"], capture_output=True),
        lambda: subprocess.run([sys.executable, "-I", "-m", "edgefuse.tools.quant"], capture_output=True),
        lambda: subprocess.Popen("edgefuse --help", shell=True),
    ]
    try:
        for call in calls:
            with pytest.raises(SlowCall, match="has no slow marker"):
                call()
        assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0
        assert len(SLOW_CALLS) == len(calls), SLOW_CALLS
    finally:
        SLOW_CALLS.clear()


@pytest.mark.slow  # a pytest run in a new process that imports ExecuTorch, as the command's cold start
def test_a_slow_call_fails_its_test_even_when_caught_and_passes_under_the_marker(tmp_path):
    """A test whose code catches the `SlowCall` still fails, naming the call; the same call under the
    ``slow`` marker reaches ExecuTorch (a pytest run of two such tests with tests/conftest.py)."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_calls.py").write_text(textwrap.dedent(
        """
        import pytest
        from executorch.exir.program._program import EdgeProgramManager

        def test_caught():
            try:
                EdgeProgramManager.to_executorch(None)
            except Exception:
                pass

        @pytest.mark.slow
        def test_marked():
            with pytest.raises(AttributeError):
                EdgeProgramManager.to_executorch(None)
        """
    ))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    assert "test_calls.py::test_caught makes a .pte program and has no slow marker" in done.stdout, done.stdout[-3000:]
