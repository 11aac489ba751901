"""The delegate map SVG (:mod:`edgefuse.compare.delegate_map`)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from edgefuse.compare.stock_and_edgefuse import DelegateSummary, Segment
from tests.cli.command_runs import SVG


def test_the_delegate_map_marks_splits_and_escapes_names():
    from edgefuse.compare.delegate_map import render

    stock = DelegateSummary("stock", [
        Segment("delegate", ["linear"], "XnnpackBackend", 0),
        Segment("outside", ["mean.dim", "_to_dim_order_copy"]),
        Segment("delegate", ["mul.Tensor"], "XnnpackBackend", 1),
    ])
    ours = DelegateSummary("edgefuse <&>", [
        Segment("delegate", ["linear", "xnn_mean"], "XnnpackBackend", 0), Segment("outside", ["gelu"]),
    ])
    assert stock.delegates == 2 and stock.splits == 1 and stock.outside == ["mean.dim", "_to_dim_order_copy"]
    root = ET.fromstring(render([stock, ours], "map"))
    assert root.tag == f"{SVG}svg"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert any(t.startswith("split: 2 ops") for t in texts)
    assert "edgefuse <&>: 1 delegate, 1 op outside, 0 splits" in texts
    assert sum("XnnpackBackend #" in t for t in texts) == 3
