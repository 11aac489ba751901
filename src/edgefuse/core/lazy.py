"""A package's public names imported on first use (PEP 562), and its submodules as attributes.

``import edgefuse`` and ``import edgefuse.xnnpack`` then load neither torch nor ExecuTorch: the command
line answers ``--help`` at once, and a ``python -m`` command can silence the warnings torch and torchao
log as they are imported before anything imports them. ``edgefuse.core.passes`` after ``import edgefuse``
imports the submodule then, as it would after ``import edgefuse.core.passes``.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from typing import Any, Callable


def lazy_names(package: str, public: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``, whose name ``n`` is defined in
    module ``public[n]``, and whose other attributes include its submodules (a name starting with ``_``
    excepted: ``__main__`` would run a command). A public name must not also be a submodule's:
    importing that submodule would bind the name to the module."""

    def __getattr__(name: str) -> Any:
        module = public.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
            setattr(sys.modules[package], name, value)  # later lookups skip this function
            return value
        if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")  # the import binds the name in the package
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        submodules = {info.name for info in pkgutil.iter_modules(sys.modules[package].__path__)}
        return sorted(set(vars(sys.modules[package])) | set(public) | {n for n in submodules if not n.startswith("_")})

    return __getattr__, __dir__
