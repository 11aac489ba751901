"""The commands run in-process through ``edgefuse.cli.main``: every built-in model reports every norm,
the benchmark, the fuzz hand-off, and the checks that fail as they should."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
import torch

import jsonschema

from edgefuse import cli  # noqa: E402
from edgefuse.inputs.errors import CHECK_FAILED, OK, UNAVAILABLE, USAGE, Unavailable, UsageError  # noqa: E402
from edgefuse.inputs.models import MODEL_NAMES  # noqa: E402
from edgefuse.inputs.modelspec import resolve  # noqa: E402
from edgefuse.compare.report import build_report, schema, summary_line, to_json  # noqa: E402


# --- in-process: every built-in model, the benchmark, the fuzz hand-off ---------------------------------

#: The classes of the norm modules of the built-in models: Hugging Face's ``<Model>RMSNorm``, Mamba2's
#: gated ``MambaRMSNormGated`` and T5's ``T5LayerNorm`` (an RMSNorm by another name).
NORM_CLASSES = ("RMSNorm", "RMSNormGated", "T5LayerNorm")

#: The kinds of norm (:func:`_kinds`) each built-in model shows. Between them the four models of the fast
#: tier (:data:`FAST`) show every kind the 13 show: Llama, Qwen2, Mistral, Phi-3, SmolLM3, Granite and OLMo2
#: have only float16 ``RMSNorm`` rebuilt without a note (as Mamba2's), Gemma and Gemma2 only float32 ones
#: (as Gemma3's). So the fast tier reports on these four and the slow tier on every built-in model, each
#: held to its own entry: a change in what any model shows fails its case.
KINDS = {
    "tiny-qwen3": {  # QK-norms over heads, which no QNN limit covers in an unknown quantized precision
        ("RMSNorm", "rsqrt+weight", "float16", "rebuilt", None),
        ("RMSNorm", "rsqrt+weight", "float16", "rebuilt", "no limit of qnn covers <shape> in quantized"),
    },
    "tiny-gemma3": {  # ``1 + w`` in float32: left where the norm computes in float16, rebuilt where in float32
        ("RMSNorm", "rsqrt+weight", "float16", "the weight <node> is float32 and qnn takes one dtype (float16)", None),
        ("RMSNorm", "rsqrt+weight", "float32", "rebuilt", None),
    },
    "tiny-t5": {  # the norm module named T5LayerNorm
        ("T5LayerNorm", "rsqrt+weight", "float16", "rebuilt", None),
    },
    "tiny-mamba2": {  # the gated, grouped norm in float32 beside float16 and float32 plain ones
        ("RMSNorm", "rsqrt+weight", "float16", "rebuilt", None),
        ("RMSNorm", "rsqrt+weight", "float32", "rebuilt", None),
        ("RMSNormGated", "grouped-rsqrt", "float32", "rebuilt", "no limit of qnn covers <shape> in quantized"),
    },
    **{name: {("RMSNorm", "rsqrt+weight", "float16", "rebuilt", None)}
       for name in ("tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-phi3", "tiny-smollm3", "tiny-granite",
                    "tiny-olmo2")},
    **{name: {("RMSNorm", "rsqrt+weight", "float32", "rebuilt", None)} for name in ("tiny-gemma", "tiny-gemma2")},
}
#: The models the fast tier reports on.
FAST = ("tiny-qwen3", "tiny-gemma3", "tiny-t5", "tiny-mamba2")


def _kinds(report, classes: dict[str, str]) -> set[tuple]:
    """The kinds of norm a report holds: (norm class, form, dtype, reason, note), the reason and the note up
    to their first ``:`` or ``;``, with the norm's node names and shapes left out."""

    def kind(text: str | None, decision) -> str | None:
        if text is None:
            return None
        for name in filter(None, (decision.mean, decision.input, decision.weight, decision.node)):
            text = re.sub(rf"\b{re.escape(name)}\b", "<node>", text)
        return re.split(r"[:;]", re.sub(r"\[[\d, ]+\]", "<shape>", text))[0]

    return {(classes.get(row.decision.module_path), row.decision.form, str(row.decision.dtype).removeprefix("torch."),
             kind(row.decision.reason, row.decision), kind(row.decision.note, row.decision)) for row in report.rows}


@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in FAST else pytest.mark.slow)
                                  for name in MODEL_NAMES])
def test_every_built_in_model_reports_every_norm_module_in_float16(name):
    """Each norm module has a row, each norm is rebuilt or says why not, the report is within tolerance and
    its JSON is valid; the model's kinds of norm are those :data:`KINDS` names for it."""
    # float16 at the capture stage: the norms round where they compute, which may be a finer or coarser
    # dtype than the outputs' (Mamba2's outputs are float32), so the check's tolerances are exercised.
    spec = resolve(name, torch.float16)
    classes = {path: next(c for c in NORM_CLASSES if type(module).__name__.endswith(c))
               for path, module in spec.module.named_modules() if type(module).__name__.endswith(NORM_CLASSES)}
    assert classes, "the model has no norm module"
    report = build_report(spec, backend="qnn", stage="capture")
    rows = {row.decision.module_path: row for row in report.rows}
    assert not set(classes) - set(rows), f"norm modules without a row: {sorted(set(classes) - set(rows))}"
    for row in report.rows:
        decision = row.decision
        assert decision.rebuilt or (decision.reason and decision.reason != "rebuilt"), decision
        assert decision.module_path, decision  # where the norm is, for every norm of a real model
    assert report.ok, summary_line(report)
    data = to_json(report)
    jsonschema.validate(data, schema(), cls=jsonschema.Draft202012Validator)
    assert data["summary"]["rebuilt"] + data["summary"]["left"] == data["summary"]["norms"]
    kinds = _kinds(report, classes)
    assert kinds == KINDS[name], sorted(kinds, key=repr)


def test_the_fast_tier_reports_on_models_that_show_every_kind_of_norm():
    """Every built-in model has its kinds recorded, and the fast tier's four show every kind recorded."""
    assert set(KINDS) == set(MODEL_NAMES), sorted(set(KINDS) ^ set(MODEL_NAMES))
    shown = set().union(*(KINDS[name] for name in FAST))
    missing = set().union(*KINDS.values()) - shown
    assert not missing, f"kinds of norm no model of the fast tier shows: {sorted(missing, key=repr)}"


class TwoInlineNorms(torch.nn.Module):
    """One module that computes two norm-like chains in its own forward (no norm submodules); the second
    averages cubes, so it stays decomposed."""

    def forward(self, x):
        a = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        b = x * torch.rsqrt(x.pow(3).abs().mean(-1, keepdim=True) + 1e-5)
        return a + 2 * b


def test_two_norms_of_one_module_get_rows_and_quantization_facts_of_their_own():
    """They share a module path, so each row names its mean too, says its error is the module's, and is
    matched to its own norm's quantization facts."""
    from edgefuse.inputs.modelspec import ModelSpec
    from edgefuse.qnn.quantizer import quantization_by_norm
    from edgefuse.compare.report import add_quantization, format_report

    module = torch.nn.Sequential(TwoInlineNorms())
    spec = ModelSpec("two-norms", "file", (torch.randn(2, 3, 16),), module=module)
    report = build_report(spec, backend="qnn", stage="capture")
    assert [r.decision.module_path for r in report.rows] == ["0", "0"] and all(r.shared for r in report.rows)
    assert [r.decision.rebuilt for r in report.rows] == [True, False]
    add_quantization(report, "qnn", quantization_by_norm(module, spec.inputs))
    assert [r.quantized.how for r in report.rows] == ["one op", "pieces"], [r.quantized for r in report.rows]
    table = format_report(report)
    for row in report.rows:
        assert f"0 ({row.decision.mean})" in table, table
    assert table.count(" (module)") == 2, table
    assert report.ok, summary_line(report)


def test_report_of_a_saved_program_compares_with_that_program(workdir, capsys):
    assert cli.main(["-q", "report", str(workdir / "block.pt2")]) == OK
    out = capsys.readouterr().out
    assert "block.pt2 (float16), edge stage, backend qnn: 1 norm\n" in out
    assert "1 of 1 norms rebuilt" in out and "max error against program" in out
    # The reference is the saved program, so what to_edge alone changes shows as for the eager model.
    spec = resolve(f"{workdir / 'models.py'}:logsumexp")
    torch.export.save(spec.export(), str(workdir / "logsumexp.pt2"))
    errors = {}
    for model in (f"{workdir / 'models.py'}:logsumexp", str(workdir / "logsumexp.pt2")):
        assert cli.main(["-q", "report", model, "--json"]) == OK
        errors[model] = json.loads(capsys.readouterr().out)["summary"]["unrewritten_max_error"]
    assert len(set(errors.values())) == 1 and next(iter(errors.values())) > 0, errors


@pytest.mark.slow
def test_lower_and_bench_of_a_saved_program_name_that_program_as_the_reference(workdir, capsys):
    assert cli.main(["-q", "lower", str(workdir / "block.pt2"), "-o", str(workdir / "saved.pte")]) == OK
    out = capsys.readouterr().out
    assert out.count("max error against program") == 2 and "eager" not in out, out
    assert cli.main(["-q", "bench", str(workdir / "block.pt2"), "--runs", "10", "--warmup", "1"]) == OK
    out = capsys.readouterr().out
    assert "err vs program" in out and "eager" not in out, out


def test_a_norm_the_graph_already_holds_as_one_op_is_counted_not_hidden(workdir, capsys):
    # torch.nn.RMSNorm is one aten.rms_norm in the captured graph and decomposed by to_edge.
    model = f"{workdir / 'models.py'}:torch_norm"
    counts = {}
    for stage in ("capture", "edge"):
        assert cli.main(["-q", "report", model, "--stage", stage, "--json"]) == OK
        data = json.loads(capsys.readouterr().out)
        jsonschema.validate(data, schema(), cls=jsonschema.Draft202012Validator)
        counts[stage] = (data["summary"]["norms"], data["summary"]["rebuilt"], data["summary"]["already_one_op"])
    assert counts == {"capture": (0, 0, 1), "edge": (1, 1, 0)}
    assert cli.main(["-q", "report", model, "--stage", "capture"]) == OK
    assert "0 of 0 norms rebuilt, 0 left decomposed, 1 already one rms_norm op;" in capsys.readouterr().out
    assert cli.main(["-q", "report", f"{model}_in_cond", "--stage", "capture"]) == OK  # one inside a branch
    assert "0 of 0 norms rebuilt, 0 left decomposed, 2 already rms_norm ops;" in capsys.readouterr().out


def test_report_says_a_model_without_float_weights_has_none(workdir, capsys):
    assert cli.main(["-q", "report", f"{workdir / 'models.py'}:rank7"]) == OK
    assert "models.py:rank7 (no float weights), edge stage, backend qnn: 1 norm\n" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_alternates_and_prints_ratios(workdir, monkeypatch, capsys):
    from edgefuse.runtime import LoadedProgram

    calls, execute = [], LoadedProgram.execute
    monkeypatch.setattr(LoadedProgram, "execute", lambda self, flat: calls.append(self) or execute(self, flat))
    code = cli.main(["-q", "bench", f"{workdir / 'models.py'}:block", "--runs", "10", "--warmup", "1"])
    out = capsys.readouterr().out
    assert code == OK, out
    # the timed calls: stock and edgefuse in turn, 1 warm-up and 10 kept rounds each, never one twice in a row
    assert len(calls) == 22 and calls[0] is not calls[1], calls
    assert all(call is calls[0] for call in calls[0::2]) and all(call is calls[1] for call in calls[1::2])
    assert "10 runs each alternating after 1 warm-up" in out
    assert "\n1 thread(s); CPU: " in out and "float16" in out  # the features the timing ran with
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("stock ", "edgefuse "))}
    assert set(rows) == {"stock", "edgefuse"}
    assert rows["stock"][-3] == rows["edgefuse"][-3] == "yes"
    # the ratio is edgefuse's median over stock's: printed to 0.1 us and 0.01, so equal within that rounding
    stock, ours, ratio = float(rows["stock"][-2]), float(rows["edgefuse"][-2]), float(rows["edgefuse"][-1])
    assert stock > 0 and ours > 0 and ratio > 0
    assert (ours - 0.05) / (stock + 0.05) - 0.005 <= ratio <= (ours + 0.05) / (stock - 0.05) + 0.005, rows


@pytest.mark.slow
def test_lower_exits_1_and_says_so_when_the_stock_program_fails_its_check(workdir, monkeypatch, capsys):
    import edgefuse.compare.pte_checks as flows

    real = flows.run_and_check

    def stock_off(lowered, inputs, expected, stock=None, reference="eager"):
        checked = real(lowered, inputs, expected, stock, reference)
        if lowered.how == "stock":
            checked.errors = [e + 1.0 for e in checked.errors]
        return checked

    monkeypatch.setattr(flows, "run_and_check", stock_off)
    code = cli.main(["-q", "lower", f"{workdir / 'models.py'}:block", "-o", str(workdir / "stock_off.pte")])
    out = capsys.readouterr().out
    assert code == CHECK_FAILED, out
    assert out.strip().splitlines()[-1] == "check failed: the stock program differs from eager by more than allowed"


def test_fuzz_hands_its_arguments_over(monkeypatch, capsys):
    seen = []
    module = type(sys)("edgefuse.fuzz")
    module.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "edgefuse.fuzz", module)
    assert cli.main(["fuzz", "--cases", "3", "--help"]) == OK
    assert cli.main(["-q", "fuzz", "--cases", "3"]) == OK
    assert seen == [["--cases", "3", "--help"], ["--quiet", "--cases", "3"]]


def test_fuzz_says_so_when_the_fuzzer_is_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "edgefuse.fuzz", None)  # import edgefuse.fuzz now raises ImportError
    assert cli.main(["fuzz"]) == UNAVAILABLE
    assert "edgefuse fuzz is unavailable" in capsys.readouterr().err


def test_edgefuse_lowering_missing_is_unavailable_not_a_crash(monkeypatch):
    from edgefuse.compare.stock_and_edgefuse import edgefuse_lower

    monkeypatch.setitem(sys.modules, "edgefuse.xnnpack", None)
    with pytest.raises(Unavailable, match="edgefuse's XNNPACK lowering is unavailable"):
        edgefuse_lower(object())


def test_bad_usage_in_process(workdir, capsys):
    assert cli.main(["report", str(workdir / "models.py")]) == USAGE
    assert "names a file but no function" in capsys.readouterr().err
    assert cli.main(["report", f"{workdir / 'models.py'}:nothere"]) == USAGE
    functions = ("block, counter, data_dependent, integer_output, logsumexp, masked, not_in_edge, on_meta, raises, rank7, "
                 "returns_buffer, stateful, torch_norm, torch_norm_in_cond, with_cond, writes_weight, wrong_inputs")
    assert f"functions defined there: {functions}" in capsys.readouterr().err
    assert cli.main(["report", f"{workdir / 'models.py'}:block", "--backend", "npu9"]) == USAGE
    assert "unknown backend 'npu9'" in capsys.readouterr().err
    assert cli.main(["report", str(workdir / "block.pt2"), "--dtype", "float32"]) == USAGE
    assert "saved program" in capsys.readouterr().err
    assert cli.main(["lower", f"{workdir / 'models.py'}:block", "-o", "out.bin"]) == USAGE
    assert "must end in .pte" in capsys.readouterr().err
    block = f"{workdir / 'models.py'}:block"
    assert cli.main(["bench", block, "--warmup", "-5"]) == USAGE
    assert "--warmup must be 0 or more" in capsys.readouterr().err
    assert cli.main(["bench", block, "--threads", "100000"]) == USAGE  # the runtime would crash on it
    assert f"--threads must be at most {4 * (os.cpu_count() or 1)}" in capsys.readouterr().err
    assert cli.main(["report", block, "--quantize", "qnn", "--stage", "edge"]) == USAGE
    assert "quantizes the captured graph: use --stage capture" in capsys.readouterr().err
    assert cli.main(["report", block, "--quantize", "qnn", "--backend", "aten"]) == USAGE
    assert "rebuilds the norms for the qnn backend" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["report"])  # argparse: MODEL is required
    assert exit_.value.code == USAGE


@pytest.mark.slow
def test_a_model_that_writes_its_input_or_a_buffer_is_compared_on_fresh_copies(workdir, capsys):
    # every run (eager, both programs, the .pte) sees the inputs and state the first one saw; the input
    # the .pte writes, which the runtime returns before the model's output, is not taken for an output
    for model in ("stateful", "counter", "returns_buffer", "writes_weight"):
        for stage in ("edge", "capture"):
            assert cli.main(["-q", "report", f"{workdir / 'models.py'}:{model}", "--stage", stage]) == OK
            assert "1 of 1 norms rebuilt" in capsys.readouterr().out
        if model == "writes_weight":
            continue  # ExecuTorch's XNNPACK lowering rejects a program that writes a weight it delegates
        assert cli.main(["-q", "lower", f"{workdir / 'models.py'}:{model}", "-o", str(workdir / f"{model}.pte")]) == OK
        assert "wrote" in capsys.readouterr().out


def test_the_demo_refuses_a_map_folder_it_cannot_make_before_any_work(tmp_path, monkeypatch, capsys):
    import tempfile

    (tmp_path / "not-a-folder").write_text("a file where the temporary directory should be")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "not-a-folder"))
    assert cli.main(["-q", "demo"]) == USAGE
    out, err = capsys.readouterr()
    assert "cannot be made" in err and "TMPDIR" in err and "Traceback" not in err
    assert out == ""  # nothing was run


def test_a_model_file_using_torch_cond_exports(workdir, capsys):
    # export re-imports the module of the code it traces: the file's module must be importable by name
    assert cli.main(["-q", "report", f"{workdir / 'models.py'}:with_cond"]) == OK
    assert "inside the subgraph" in capsys.readouterr().out


def test_report_quantize_table_has_a_column_for_how_each_norm_was_quantized(workdir, capsys):
    assert cli.main(["-q", "report", f"{workdir / 'models.py'}:block", "--quantize", "qnn"]) == OK
    out = capsys.readouterr().out
    assert "quantized for qnn" in out.splitlines()[0]
    assert "quantized as" in out and "one op (rms_norm): 1 pair in, 0 inside, 1 out, 1 constant" in out
    assert out.strip().splitlines()[-1] == (
        "quantized for qnn: 1 of 1 norms as one op; the norms cost 3 quantize/dequantize pairs"
    )


def test_a_mismatch_exits_1(workdir, monkeypatch, capsys):
    import edgefuse.compare.report as report

    real = report.compare

    def off_by_a_lot(reference, actual, ulps=2.0, dtype=None):
        return real(reference, actual + 1.0, ulps, dtype)

    monkeypatch.setattr(report, "compare", off_by_a_lot)
    assert cli.main(["-q", "report", f"{workdir / 'models.py'}:block", "--stage", "capture"]) == CHECK_FAILED
    assert "OUTSIDE the allowed" in capsys.readouterr().out


# --- the python -m commands fail as `edgefuse` does ---------------------------------------------------------

def _latency(monkeypatch, raised):
    from edgefuse.tools import llm_latency

    def run(args, say):
        raise raised

    monkeypatch.setattr(llm_latency, "run", run)
    return llm_latency.main(["-q", "--export-only", "--dir", "unused"])


def _qnn_check(monkeypatch, raised, module: str, argv: list[str]):
    import importlib

    from edgefuse.compare import qnn_flows

    def require_libraries():
        raise raised

    monkeypatch.setattr(qnn_flows, "require_libraries", require_libraries)
    return importlib.import_module(module).main(argv)


COMMANDS = {
    "llm_latency": _latency,
    "qnn_check": lambda monkeypatch, raised: _qnn_check(monkeypatch, raised, "edgefuse.tools.qnn_check",
                                                        ["-q", "--models", "tiny-llama-layer", "--precisions", "fp16"]),
    "llm_qnn_check": lambda monkeypatch, raised: _qnn_check(monkeypatch, raised, "edgefuse.tools.llm_qnn_check",
                                                            ["--cases", "llama-fp16"]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("raised, code, message", [
    (RuntimeError("a bug"), 4, "internal error (a bug in edgefuse"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (Unavailable("no QNN libraries"), UNAVAILABLE, "no QNN libraries"),
    (UsageError("bad input"), USAGE, "bad input"),
])
def test_the_python_m_commands_turn_what_they_raise_into_the_exit_codes_of_edgefuse(
        command, raised, code, message, monkeypatch, capsys):
    assert COMMANDS[command](monkeypatch, raised) == code
    err = capsys.readouterr().err
    assert f"python -m edgefuse.tools.{command}: {message}" in err or (
        command == "llm_qnn_check" and code == UNAVAILABLE and message in err)
