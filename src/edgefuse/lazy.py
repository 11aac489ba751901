"""A package's public names imported on first use (PEP 562).

``import edgefuse`` and ``import edgefuse.xnnpack`` then load neither torch nor ExecuTorch: the command
line answers ``--help`` at once, and a ``python -m`` command can silence the warnings torch and torchao
log as they are imported before anything imports them.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_names(package: str, public: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``, whose name ``n`` is defined in
    module ``public[n]``. A name must not also be a submodule's: importing that submodule would bind
    the name to the module."""

    def __getattr__(name: str) -> Any:
        module = public.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(public))

    return __getattr__, __dir__
