"""The report's schema and the layers it reads from module paths (:mod:`edgefuse.compare.report`)."""

from __future__ import annotations

import jsonschema

from edgefuse.compare.report import layer_of, schema


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(schema())


def test_layers_are_read_from_module_paths():
    assert layer_of("model.model.layers.1.self_attn.q_norm") == "layers.1"
    assert layer_of("model.encoder.block.0.layer.1.layer_norm") == "encoder.block.0"
    assert layer_of("model.model.norm") is None
    assert layer_of("norms.0") is None  # a list of norms is not a list of layers
    assert layer_of(None) is None
