"""The project's rule for a public name, which the tests of everything users copy (the documents'
examples, the fuzzer's reproducers) hold them to."""

from __future__ import annotations

import importlib


def public(module: str, name: str) -> bool:
    """Whether ``name`` of ``module`` is public: the module is ``edgefuse`` or a package or module right under
    it (``edgefuse.fuzz``, ``edgefuse.passes``), and its ``__all__`` (the lazy table's names) declares it."""
    parts = module.split(".")
    if parts[0] != "edgefuse" or len(parts) > 2 or any(p.startswith("_") for p in parts):
        return False
    return name in getattr(importlib.import_module(module), "__all__", ())
