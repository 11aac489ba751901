"""``python -m edgefuse.quant``: its verdicts, its JSON, and clear errors for bad options."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from edgefuse.quant import table
from edgefuse.quant.__main__ import _json_safe, main


@pytest.mark.parametrize("option, value", [("--models", "tiny-lama"), ("--dtypes", "float8"), ("--schemes", "qs4"), ("--xnnpack-dtypes", ",")])
def test_a_bad_option_is_a_usage_error_before_any_work(option, value):
    done = subprocess.run([sys.executable, "-m", "edgefuse.quant", option, value], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"{option}:" in done.stderr and "choose from" in done.stderr and "Traceback" not in done.stderr


def test_a_nan_output_is_the_largest_error_not_a_skipped_one():
    inputs = [(torch.zeros(3),), (torch.ones(3),)]
    nan_on_ones = table.errors(lambda x: x / x.sum() if x.sum() == 0 else x, lambda x: x, inputs)
    assert nan_on_ones.per_input[0] == math.inf and nan_on_ones.max == math.inf
    assert nan_on_ones.per_input[1] == 0.0


def test_own_error_changes_count_a_norm_measured_in_one_flow_only_as_missing():
    row = table.QnnRow("m", "float32", rebuilt=["a", "b", "c", "d"])
    row.own = {"casts": {"a": 2.0, "b": 1.0, "c": 1.0}, "edgefuse": {"a": 1.0, "b": 1.0, "c": 1.5, "d": 0.0}}
    changes = table.own_error_changes(row)
    assert (changes.lower, changes.same, changes.higher, changes.missing) == (["a"], ["b"], ["c"], ["d"])
    assert str(changes) == "1/1/1, 1 not measured"


def test_json_has_no_nan_or_infinity_a_reader_would_choke_on():
    safe = _json_safe({"e": [math.nan, 1.0, -math.inf], "k": (math.inf,)})
    assert safe == {"e": ["nan", 1.0, "-inf"], "k": ["inf"]}
    json.dumps(safe, allow_nan=False)


def test_the_qnn_table_of_tiny_llama_measures_every_norm_and_passes(tmp_path, capsys):
    """The command as a user runs it (one model and dtype): every norm rebuilt and annotated as one op,
    its own error no higher than not rebuilt, exit 0, and JSON that strict readers accept."""
    path = tmp_path / "quant.json"
    status = main(["--models", "tiny-llama", "--dtypes", "float32", "--no-xnnpack", "--json", str(path), "-q"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "tiny-llama  float32  5      5        5, 5" in out and "5/0/0" in out, out
    (row,) = json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(f"JSON holds {name}"))["qnn"]
    assert sorted(row["own"]["edgefuse"]) == sorted(row["rebuilt"]) == sorted(row["own"]["casts"])
    assert all(row["own"]["edgefuse"][k] <= row["own"]["casts"][k] for k in row["rebuilt"])
