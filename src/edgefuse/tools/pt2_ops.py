"""``python -m edgefuse.tools.pt2_ops``: print the operator lists of :mod:`edgefuse.inputs.pt2_ops` as this
torch's schemas make them, to paste into that module when torch changes (its test fails then)."""

from __future__ import annotations

import argparse
import sys


def _wrapped(overloads: list[str], indent: str = "    ") -> str:
    lines, line = [], indent
    for overload in overloads:
        if len(line) + len(overload) + 1 > 110:
            lines.append(line.rstrip())
            line = indent
        line += overload + " "
    lines.append(line.rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the lists as this torch's schemas make them (``argv`` takes only ``--help``)."""
    argparse.ArgumentParser(prog="python -m edgefuse.tools.pt2_ops", description=__doc__.split("\n\n")[0]).parse_args(argv)
    from edgefuse.inputs.pt2_ops import allowed_by_rule

    functional, in_place = allowed_by_rule()
    for title, table in (("FUNCTIONAL", functional), ("IN_PLACE", in_place)):
        print(f"{title}")
        for namespace, overloads in table.items():
            if overloads:
                print(f'    "{namespace}": _overloads("""\n{_wrapped(overloads)}\n    """),')
    return 0


if __name__ == "__main__":
    sys.exit(main())
