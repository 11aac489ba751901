"""``from edgefuse.passes import RecomposeRmsNorm, RemoveRedundantCasts``: the passes of the rewriting core
(:mod:`edgefuse.core.passes`) under the name the public API gives them."""

from edgefuse.core.passes import RecomposeRmsNorm, RemoveRedundantCasts

__all__ = ["RecomposeRmsNorm", "RemoveRedundantCasts"]
