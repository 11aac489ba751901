"""Marks each test with its layer, the folder it lives in, so one layer runs alone.

``python -m pytest -m core`` (or ``python -m pytest tests/core``) runs the rewriting core's tests alone, and
``python -m pytest -m rules`` only its numbered rules' tests (``tests/core/test_rule*.py``, well under a minute);
the other layers are ``runtime``, ``quant``, ``xnnpack``, ``qnn``, ``llm``, ``inputs``, ``compare``, ``tools``,
``cli`` and ``fuzz``. ``tests`` is a package, so the shared helpers are imported by their full name
(``from tests.harness import ...``) wherever a test file lives; pytest puts the repository root on ``sys.path``
for it."""

from __future__ import annotations

from pathlib import Path

import pytest

LAYERS = ("core", "runtime", "quant", "xnnpack", "qnn", "llm", "inputs", "compare", "tools", "cli", "fuzz")

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(item.path).relative_to(_HERE).parts
        if len(parts) > 1 and parts[0] in LAYERS:
            item.add_marker(getattr(pytest.mark, parts[0]))
        if parts[0] == "core" and parts[-1].startswith("test_rule"):
            item.add_marker(pytest.mark.rules)
