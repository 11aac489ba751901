"""Run a command until it first imports torch or ExecuTorch, and see what it wrote to stderr before that;
run code in a new interpreter, to see what it imports.

A ``sitecustomize`` module in a folder put first on ``PYTHONPATH`` adds an import finder to the new
process before any of its code runs; when the command first asks for ``torch`` or ``executorch`` the
finder writes :data:`MARK` and the module's name to stderr and ends the process. So a test learns, in a
second or two and without loading either library, what the command said before its first heavy import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

#: The line the finder writes when the command first imports torch or ExecuTorch.
MARK = "<<first heavy import>>"

_SITECUSTOMIZE = textwrap.dedent(
    f"""
    import os, sys

    class _FirstHeavyImport:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("torch", "executorch"):
                sys.stderr.flush()
                os.write(2, ("{MARK} " + name + "\\n").encode())
                os._exit(0)
            return None

    sys.meta_path.insert(0, _FirstHeavyImport())
    """
)


@dataclass
class BeforeImport:
    """What the command did up to its first heavy import: its exit code, stderr lines before the mark,
    and the module it was importing (None: it never imported torch or ExecuTorch)."""

    code: int
    said: list[str]
    importing: str | None
    stderr: str


def until_first_heavy_import(argv: list[str], folder: Path) -> BeforeImport:
    """Run ``python ARGV`` (``-m edgefuse ...``, ``-m edgefuse.tools.NAME ...``) with the finder."""
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    source = Path(__file__).resolve().parent.parent / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(source)]))
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, env=env,
                          cwd=folder)
    lines = done.stderr.splitlines()
    marked = [k for k, line in enumerate(lines) if line.startswith(MARK)]
    if not marked:
        return BeforeImport(done.returncode, lines, None, done.stderr)
    return BeforeImport(done.returncode, lines[:marked[0]], lines[marked[0]].split()[-1], done.stderr)


def fresh_python(code: str) -> dict:
    """Run ``code`` in a new interpreter; it prints one JSON object, returned here."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
