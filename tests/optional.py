"""The optional flows' packages (Model Explorer, Hugging Face's exporter): a test that needs one skips where
it is absent, naming the command that installs it. `.ci/run` installs each, so CI runs every such test."""

from __future__ import annotations

import importlib.util

import pytest

#: The commands that install each optional flow's packages for the tests, under the pins of constraints.txt.
INSTALL_EXPLORER = "pip install -e '.[test,explorer]' -c constraints.txt"
INSTALL_CHROMIUM = "apt-get install chromium"
INSTALL_OPTIMUM = "pip install --no-deps -c constraints.txt optimum-executorch optimum accelerate"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (a missing parent package counts as absent)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, install: str, what: str) -> None:
    """Skip the calling test unless ``module`` can be imported, saying ``what`` is missing and ``install``."""
    if not installed(module):
        pytest.skip(f"{what} is not installed: {install}")


def require_optimum() -> None:
    """Skip unless optimum-executorch can be imported (it is installed without its dependencies: its pin of
    transformers 5.0.0rc1 is not the tests' 5.23.0; constraints.txt)."""
    require("optimum.exporters.executorch", INSTALL_OPTIMUM, "optimum-executorch")
