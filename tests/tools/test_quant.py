"""``python -m edgefuse.tools.quant``: its verdicts, its JSON, and clear errors for bad options."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from edgefuse.core._fx import dtype_name
from edgefuse.compare import quant_tables as table
from edgefuse.tools.quant import _json_safe, main
from tests.first_import import until_first_heavy_import


@pytest.mark.slow  # starts python -m edgefuse.tools.quant
def test_a_bad_option_is_a_usage_error_before_any_work_with_no_traceback(tmp_path):
    """The command as a user runs it: the usage error comes first, with no notice of loading torch, which
    it never imports (the process would end there: :mod:`tests.first_import`)."""
    ran = until_first_heavy_import(["-m", "edgefuse.tools.quant", "--json", "/nonexistent/dir/out.json"], tmp_path)
    assert ran.code == 2 and ran.importing is None, ran.stderr
    assert ran.said[0].startswith("usage:") and "Traceback" not in ran.stderr, ran.stderr
    assert ran.said[-1].endswith("--json /nonexistent/dir/out.json: not a file in an existing directory"), ran.stderr


@pytest.mark.parametrize("argv, message", [
    (["--models", "tiny-lama"], "--models: unknown 'tiny-lama'; choose from tiny-llama"),
    (["--dtypes", "float8"], "--dtypes: unknown 'float8'"),
    (["--schemes", "qs4"], "--schemes: unknown 'qs4'"),
    (["--xnnpack-dtypes", ","], "--xnnpack-dtypes: nothing given"),
    (["--quant-dtype", "use_8a9w"], "--quant-dtype: unknown 'use_8a9w'"),
    (["--no-qnn", "--no-xnnpack"], "nothing to measure"),
    (["--json", "/nonexistent/dir/out.json"], "not a file in an existing directory"),
])
def test_each_bad_option_names_itself(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_names_are_read_with_spaces_and_repeats_forgiven(capsys):
    with pytest.raises(SystemExit):
        main(["--models", "tiny-llama, tiny-llama ,tiny-qwen3", "--dtypes", "float8"])
    assert "--dtypes" in capsys.readouterr().err  # the models passed


def test_the_quant_dtypes_known_up_front_are_the_released_ones():
    from edgefuse.qnn.quantizer import QUANT_DTYPES, load_quantizer_module

    assert QUANT_DTYPES == tuple(d.name for d in load_quantizer_module().QuantDtype)


def test_a_nan_output_is_the_largest_error_not_a_skipped_one():
    inputs = [(torch.zeros(3),), (torch.ones(3),)]
    nan_on_zeros = table.errors(lambda x: x / x.sum(), lambda x: x / 3, inputs)
    assert nan_on_zeros.per_input[0] == math.inf and nan_on_zeros.max == math.inf
    assert nan_on_zeros.per_input[1] == 0.0


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


@pytest.mark.slow  # quantizes and lowers tiny-llama for QNN
def test_the_qnn_table_of_tiny_llama_measures_every_norm_and_passes(tmp_path, capsys, monkeypatch, caplog):
    """The command as a user runs it (one model and dtype): every norm rebuilt and annotated as one op,
    its own error no higher than not rebuilt, exit 0, and JSON that strict readers accept."""
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")  # the command sets it; keep it to this test
    threads = torch.get_num_threads()
    path = tmp_path / "quant.json"
    try:
        status = main(["--models", "tiny-llama", "--dtypes", "float32", "--no-xnnpack", "--json", str(path), "-q"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert status == 0, out
    # the Qualcomm code's set-up notes ("QNN_SDK_ROOT is set but empty") and deprecations are held back
    assert [r.getMessage() for r in caplog.records if r.levelno < logging.ERROR] == []
    measured = json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(f"JSON holds {name}"))
    assert measured["qnn_unavailable"] is None and measured["xnnpack"] == []
    (row,) = measured["qnn"]
    assert (row["norms"], len(row["rebuilt"]), row["one_op"]["edgefuse"], row["one_op"]["casts"]) == (5, 5, 5, 0)
    assert sorted(row["own"]["edgefuse"]) == sorted(row["rebuilt"]) == sorted(row["own"]["casts"])
    assert all(row["own"]["edgefuse"][k] <= row["own"]["casts"][k] for k in row["rebuilt"])
    assert "5/0/0" in out  # the table's own-error cell: 5 lower, none the same or higher


# --- exit status and order, with the slow flows replaced by rows as they would come back ---------------

def _passing_xnnpack_row(model, dtype, scheme, say=None):
    return table.XnnpackRow(model, dtype_name(dtype), scheme, delegates={"stock": 3, "edgefuse": 1},
                            means_outside={"stock": 2, "edgefuse": 0})


def _passing_qnn_row(model, dtype, say=None, quant_dtype=None):
    row = table.QnnRow(model, dtype_name(dtype), norms=2, rebuilt=["a", "b"])
    row.own = {"casts": {"a": 2.0, "b": 1.0}, "edgefuse": {"a": 1.0, "b": 0.5}}
    return row


def _fake_flows(monkeypatch, calls, *, qnn_missing=None, xnnpack_row=_passing_xnnpack_row,
                qnn_row=_passing_qnn_row):
    """Replace the flows the command runs by ``xnnpack_row`` and ``qnn_row``, and the import of the QNN
    quantizer by one that fails with ``qnn_missing`` (if given); ``calls`` records the order in which the
    command asked for them. The fakes take what the real ones take, the same way (``say`` by keyword:
    the real flows' next positional parameter is the number of held-out inputs)."""
    import edgefuse.qnn.quantizer as qnn

    def xnnpack(model, dtype, scheme, *, say):
        assert isinstance(dtype, torch.dtype) and callable(say)
        calls.append(("xnnpack", model))
        return xnnpack_row(model, dtype, scheme)

    def load_quantizer_module():
        calls.append(("qnn import",))
        if qnn_missing is not None:
            raise qnn.QnnUnavailable(qnn_missing)

    def qnn_flow(model, dtype, *, say, quant_dtype):
        assert isinstance(dtype, torch.dtype) and callable(say)
        calls.append(("qnn", model))
        return qnn_row(model, dtype, quant_dtype=quant_dtype)

    monkeypatch.setattr(table, "xnnpack_row", xnnpack)
    monkeypatch.setattr(table, "qnn_row", qnn_flow)
    monkeypatch.setattr(qnn, "load_quantizer_module", load_quantizer_module)


def _run(argv, capsys, monkeypatch):
    """The command on two models, one dtype and scheme, leaving the process's loggers and warnings as they
    were (the fake flows print nothing to silence)."""
    import edgefuse.runtime.quiet

    monkeypatch.setattr(edgefuse.runtime.quiet, "quiet_libraries", lambda: None)
    threads = torch.get_num_threads()
    try:
        status = main(["--models", "tiny-llama,tiny-qwen3", "--dtypes", "float32", "--xnnpack-dtypes", "float32",
                       "--schemes", "qs8", "-q", *argv])
    finally:
        torch.set_num_threads(threads)
    return status, capsys.readouterr().out


def test_every_xnnpack_row_runs_before_the_qnn_quantizer_is_imported(monkeypatch, capsys):
    """Importing the QNN quantizer loads ExecuTorch's quantized kernels library, which changes what the
    XNNPACK programs serialize to: so the command measures XNNPACK first."""
    calls = []
    _fake_flows(monkeypatch, calls)
    status, out = _run([], capsys, monkeypatch)
    assert status == 0, out
    assert calls == [("xnnpack", "tiny-llama"), ("xnnpack", "tiny-qwen3"), ("qnn import",),
                     ("qnn", "tiny-llama"), ("qnn", "tiny-qwen3")]


def test_an_unavailable_qnn_quantizer_exits_3_and_says_why_after_the_xnnpack_table(monkeypatch, capsys):
    calls = []
    _fake_flows(monkeypatch, calls, qnn_missing="no module named 'qualcomm'")
    status, out = _run([], capsys, monkeypatch)
    assert status == 3, out
    assert "QNN: not measured: no module named 'qualcomm' (--no-qnn measures XNNPACK alone)" in out
    assert "XNNPACK, each .pte run in executorch.runtime:" in out and ("qnn", "tiny-llama") not in calls


def _failed_flow(row):
    row.failed["edgefuse"] = "RuntimeError: lowering failed"
    return row


def _mean_left_outside(row):
    row.means_outside["edgefuse"] = 1
    return row


def _higher_own_error(row):
    row.own["edgefuse"]["b"] = 1.5
    return row


def _own_error_not_measured(row):
    del row.own["edgefuse"]["b"]
    return row


_BROKEN_ROWS = [
    ("xnnpack", _failed_flow, "tiny-qwen3 float32 qs8 edgefuse: FAILED RuntimeError: lowering failed"),
    ("xnnpack", _mean_left_outside, "tiny-qwen3 float32 qs8: 1 means left outside by edgefuse"),
    ("qnn", _failed_flow, "tiny-qwen3 float32 edgefuse: FAILED RuntimeError: lowering failed"),
    ("qnn", _higher_own_error, "tiny-qwen3 float32: rebuilt b has a higher own error than not rebuilt"),
    ("qnn", _own_error_not_measured, "tiny-qwen3 float32: rebuilt b has no own error measured in both flows"),
]
#: Each broken row with QNN available, and the XNNPACK ones also with QNN unavailable (no QNN row is made then).
_CASES = [(*case, None) for case in _BROKEN_ROWS] + [
    (*case, "no module named 'qualcomm'") for case in _BROKEN_ROWS if case[0] == "xnnpack"]


@pytest.mark.parametrize("flow, breaks, says, qnn_missing", _CASES)
def test_a_failed_verdict_exits_1_and_outranks_an_unavailable_quantizer(flow, breaks, says, qnn_missing,
                                                                        monkeypatch, capsys):
    """One row of one flow fails a verdict (tiny-qwen3's, the other passes): the command names it and
    exits 1, also when QNN is unavailable (exit 3 would hide the failure)."""
    def broken(make):
        return lambda model, *args, **kwargs: (breaks if model == "tiny-qwen3" else (lambda r: r))(
            make(model, *args, **kwargs))

    rows = {f"{flow}_row": broken(_passing_xnnpack_row if flow == "xnnpack" else _passing_qnn_row)}
    _fake_flows(monkeypatch, [], qnn_missing=qnn_missing, **rows)
    status, out = _run([], capsys, monkeypatch)
    assert status == 1, out
    assert says in out, out
    assert not [line for line in out.splitlines() if line.startswith("  tiny-llama")], out  # the passing row
