"""What a command imports, in a fresh interpreter: ``import edgefuse.xnnpack`` and ``--help`` load neither
torch nor ExecuTorch, and the ``python -m`` commands say nothing on stderr as they import (``import edgefuse``
and its public names: tests/test_package.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgefuse.inputs.errors import OK, USAGE
from tests.first_import import fresh_python

pytestmark = pytest.mark.slow  # each test starts a fresh interpreter to see what an import loads


# --- what a command imports (subprocess: a fresh sys.modules) ---------------------------------------------

def test_import_edgefuse_xnnpack_does_not_import_executorch_and_its_names_still_work():
    """``python -m edgefuse.tools.xnnpack_bench`` imports the package before the command can silence torchao."""
    data = fresh_python(
        """
        import json, sys
        import edgefuse.xnnpack as xnnpack
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("executorch", "torch"))
        import edgefuse.xnnpack.lowering, edgefuse.xnnpack.partitioner  # the submodules, then the names
        from edgefuse.xnnpack import lower
        names = {name: type(getattr(xnnpack, name)).__name__ for name in xnnpack.__all__}
        print(json.dumps({"loaded": loaded, "names": names, "lower": lower.__module__}))
        """
    )
    assert not [m for m in data["loaded"] if m.partition(".")[0] == "executorch"], data["loaded"][:5]
    assert data["names"]["lower"] == "function" and data["lower"] == "edgefuse.xnnpack.lowering"
    assert "module" not in data["names"].values(), data["names"]
    assert set(data["names"]) >= {"EdgefuseXnnpackPartitioner", "SubstituteForXnnpack", "DEFAULT_SINGLE_ROW_POLICY"}


@pytest.mark.parametrize("package", ["edgefuse", "edgefuse.xnnpack", "edgefuse.fuzz"])
def test_no_name_a_package_imports_on_first_use_is_also_its_submodule(package):
    """Importing a submodule binds its name in the package, hiding a public name it shares."""
    import importlib
    import pkgutil

    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    assert submodules and not set(module._PUBLIC) & submodules


@pytest.mark.parametrize("command, argv", [
    ("edgefuse.tools.quant", ["--models", "nope"]),  # checked against the tables of the quantizers' modules
    ("edgefuse.fuzz", ["--replay", "missing.py"]),  # a file read after the fuzzer's imports
])
@pytest.mark.slow
def test_the_module_commands_say_nothing_on_stderr_as_they_import(command, argv, tmp_path):
    """torchao logs two "Failed to load" lines and torch's pytree a deprecation as they are imported;
    a command run with ``python -m`` silences them before its package or its own imports load them. Each
    command here imports torch and ExecuTorch, then stops at a usage error: stderr holds the command's own
    lines alone (its notice of what it is doing, and the error)."""
    done = subprocess.run([sys.executable, "-m", command, *argv], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == USAGE, done.stderr
    own = ("[", "usage:", " ", f"python -m {command}", "cannot replay", "still loading torch")
    assert [line for line in done.stderr.splitlines() if not line.startswith(own)] == [], done.stderr


def test_help_and_usage_errors_do_not_import_torch():
    data = fresh_python(
        """
        import contextlib, io, json, sys
        from edgefuse import cli
        codes = []
        for argv in (["--help"], ["demo", "--help"], ["report"], ["lower", "m.py:f", "-o", "out.bin"],
                     ["bench", "m.py:f", "--runs", "3"]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try:
                    codes.append(cli.main(argv))
                except SystemExit as exit_:
                    codes.append(exit_.code)
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("executorch", "torch"))
        print(json.dumps({"codes": codes, "loaded": loaded}))
        """
    )
    assert data["codes"] == [OK, OK, USAGE, USAGE, USAGE]
    assert data["loaded"] == []


def test_qnn_env_checks_the_sdks_folders_without_importing_torch(tmp_path):
    """``eval "$(edgefuse qnn env)"`` answers at once: checking who may write the SDK's folders
    (``edgefuse.runtime.files``) loads neither torch nor ExecuTorch."""
    root = tmp_path / "sdk"
    (root / "lib" / "x86_64-linux-clang").mkdir(parents=True)
    (root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so").write_bytes(b"")
    data = fresh_python(
        f"""
        import contextlib, io, json, sys
        from edgefuse import cli
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = cli.main(["qnn", "env", {str(root)!r}])
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("executorch", "torch"))
        checked = "edgefuse.runtime.files" in sys.modules
        print(json.dumps({{"code": code, "out": out.getvalue(), "loaded": loaded, "checked": checked}}))
        """
    )
    assert data["code"] == OK and "export QNN_SDK_ROOT=" in data["out"]
    assert data["checked"] and data["loaded"] == []


def test_the_console_script_is_edgefuse_cli_main():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("edgefuse") == "edgefuse.cli:main"
    assert "edgefuse-demo" not in scripts
