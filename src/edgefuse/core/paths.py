"""Paths in an FX graph: the nodes that lie between two nodes."""

from __future__ import annotations

from torch.fx import Node


def nodes_between(source: Node, sink: Node) -> list[Node]:
    """The nodes on some path from ``source`` to ``sink``, in graph order, ``sink`` included and ``source``
    not; empty when no path leads from ``source`` to ``sink``."""
    above, work = set(), [sink]
    while work:
        node = work.pop()
        if node not in above:
            above.add(node)
            work.extend(node.all_input_nodes)
    if source not in above:
        return []
    below, work = set(), [source]
    while work:
        node = work.pop()
        if node in above and node not in below:
            below.add(node)
            work.extend(node.users)
    below.discard(source)
    return [n for n in sink.graph.nodes if n in below]
