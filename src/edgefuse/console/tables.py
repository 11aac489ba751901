"""Plain-text tables for the terminal: left-aligned columns, the last one free to run long."""

from __future__ import annotations

from typing import Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    """Columns padded to their widest cell; the last column (a reason, say) is not padded."""
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header) - 1)]
    lines = []
    for r in cells:
        lines.append(indent + "  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip())
    return "\n".join(lines)
