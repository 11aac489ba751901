"""The delegate map: a picture of which ops run in which delegate, before (stock) and after (edgefuse).

Each lowered program is one column, read top to bottom in graph order: a box per delegate (named by its
backend, with its number and the ops inside it), and a box per run of ops left outside on portable
kernels. An outside run between two delegates is where the graph splits, and is marked so. The SVG is
written by hand (no plotting dependency); it opens in any browser.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence
from xml.sax.saxutils import escape

from edgefuse.compare.stock_and_edgefuse import DelegateSummary, Segment

_COLUMN = 560
_MARGIN = 20
_TOP = 78
_GAP = 3
_DELEGATE_FILL = ("#cfe3f7", "#b6d4f2")
_OUTSIDE_FILL = "#f7d9c4"
_SPLIT_STROKE = "#c0392b"
_CHARS = 88  # what fits on a box line at 11px


def render(summaries: Sequence[DelegateSummary], title: str) -> str:
    """The SVG text of the map of ``summaries`` (one column each), titled ``title``."""
    columns = [_column(s, _MARGIN + i * (_COLUMN + _MARGIN)) for i, s in enumerate(summaries)]
    width = _MARGIN + len(summaries) * (_COLUMN + _MARGIN)
    height = max([_TOP + 40] + [bottom for _, bottom in columns]) + 40
    backends = sorted({b for s in summaries for b in s.backends})
    legend = (
        f"boxes in graph order; blue: a delegate ({', '.join(backends) or 'none'}), orange: ops left outside "
        "on portable kernels, red border: the graph splits there"
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
        f'<text x="{_MARGIN}" y="24" font-size="16" font-weight="bold">{escape(title)}</text>',
        f'<text x="{_MARGIN}" y="42" fill="#555">{escape(legend)}</text>',
    ]
    parts += [svg for svg, _ in columns]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write(path: str, summaries: Sequence[DelegateSummary], title: str) -> str:
    """Write the map to ``path``; returns ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(summaries, title))
    return path


def _column(summary: DelegateSummary, x: int) -> tuple[str, int]:
    header = (
        f"{summary.label}: {_count(summary.delegates, 'delegate')}, {_count(len(summary.outside), 'op')} outside, "
        f"{_count(summary.splits, 'split')}"
    )
    parts = [f'<g class="program" data-label="{escape(summary.label)}">',
             f'<text x="{x}" y="{_TOP - 14}" font-size="13" font-weight="bold">{escape(header)}</text>']
    y = _TOP
    kinds = [s.kind for s in summary.segments]
    for i, segment in enumerate(summary.segments):
        split = segment.kind == "outside" and "delegate" in kinds[:i] and "delegate" in kinds[i + 1:]
        height = 18 + min(len(segment.ops), 60) // 3 * 2
        parts.append(_box(segment, x, y, height, split))
        y += height + _GAP
    parts.append("</g>")
    return "\n".join(parts), y


def _box(segment: Segment, x: int, y: int, height: int, split: bool) -> str:
    if segment.kind == "delegate":
        fill = _DELEGATE_FILL[(segment.index or 0) % 2]
        stroke = "#4a78a8"
        label = f"{segment.backend or 'delegate'} #{segment.index} · {_ops(segment.ops)}"
    else:
        fill = _OUTSIDE_FILL
        stroke = _SPLIT_STROKE if split else "#c98b5e"
        where = "split: " if split else "outside: "
        label = f"{where}{_ops(segment.ops)}"
    tooltip = ", ".join(segment.ops) or "(no ops)"
    width_attr = ' stroke-width="2"' if split else ""
    short = label if len(label) <= _CHARS else label[: _CHARS - 1] + "…"
    return (
        f'<g class="{segment.kind}"><title>{escape(tooltip)}</title>'
        f'<rect x="{x}" y="{y}" width="{_COLUMN}" height="{height}" rx="3" fill="{fill}" '
        f'stroke="{stroke}"{width_attr}/>'
        f'<text x="{x + 6}" y="{y + 13}">{escape(short)}</text></g>'
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _ops(ops: Sequence[str]) -> str:
    """``3 ops: 2× mul.Tensor, rsqrt``."""
    return f"{len(ops)} op{'s' if len(ops) != 1 else ''}: {_counts(ops)}"


def _counts(ops: Sequence[str]) -> str:
    return ", ".join(f"{n}× {op}" if n > 1 else op for op, n in Counter(ops).most_common())
