"""The project's own files as data, for the tests that hold them to their rules: pyproject.toml's tables
and the test pins of constraints.txt."""

from __future__ import annotations

from pathlib import Path

from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, released on its own as tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"


def pyproject() -> dict:
    """pyproject.toml, read."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pins() -> list[Requirement]:
    """Each line of constraints.txt that is not a comment, as a requirement: a name, one version, and the
    Pythons it holds for when a marker says."""
    lines = (line.strip() for line in CONSTRAINTS.read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("#")]
