"""``from edgefuse.programs import detached``: lower a copy of an exported program and leave the caller's
as it was (:mod:`edgefuse.core.programs`), under the name the public API gives it."""

from edgefuse.core.programs import detached

__all__ = ["detached"]
