"""The parts behind the commands: the report's schema and layers, the delegate map."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import jsonschema

from edgefuse.compare.stock_and_edgefuse import DelegateSummary, Segment  # noqa: E402
from edgefuse.compare.report import layer_of, schema  # noqa: E402
from tests.cli.command_runs import SVG  # noqa: E402


# --- the parts ------------------------------------------------------------------------------------------

def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(schema())


def test_layers_are_read_from_module_paths():
    assert layer_of("model.model.layers.1.self_attn.q_norm") == "layers.1"
    assert layer_of("model.encoder.block.0.layer.1.layer_norm") == "encoder.block.0"
    assert layer_of("model.model.norm") is None
    assert layer_of("norms.0") is None  # a list of norms is not a list of layers
    assert layer_of(None) is None


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
