"""The QNN half of the command line without QNN's libraries: usage errors, the models the QNN table lowers,
and the parts of the QNN comparison that read graphs and numbers (what QNN built is faked here; the
tier in tests/qnn/ lowers and runs for real)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import jsonschema
import pytest
import torch
import transformers  # noqa: F401  (the built-in models need it; pinned in the test extra)

from edgefuse import cli
from edgefuse.compare import qnn_flows
from edgefuse.inputs.errors import UNAVAILABLE, USAGE
from edgefuse.compare.qnn_flows import QNN_BACKEND, QnnProgram, describe_norm, failures
from edgefuse.inputs.qnn_models import QNN_MODEL_NAMES, build_qnn_model
from edgefuse.core.recompose import Decision, recompose_rms_norm

BLOCK = textwrap.dedent(
    '''
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(1 + 0.1 * torch.randn(32))
            self.linear = nn.Linear(32, 32)

        def forward(self, x):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.linear(self.weight * h)


    def block():
        torch.manual_seed(0)
        return Block(), (torch.randn(1, 8, 32),)
    '''
)


@pytest.fixture(scope="module")
def block(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("qnn_cli") / "models.py"
    path.write_text(BLOCK)
    return f"{path}:block"


# --- usage errors: exit 2 before any lowering -------------------------------------------------------------

USAGE_CASES = {
    "--soc without --backend qnn": (["lower", "{block}", "-o", "{out}", "--soc", "SM8650"],
                                    "--soc is for QNN: add --backend qnn"),
    "--precision without --backend qnn": (["lower", "{block}", "-o", "{out}", "--precision", "16a8w"],
                                          "--precision is for QNN: add --backend qnn"),
    "an unknown SoC": (["lower", "{block}", "-o", "{out}", "--backend", "qnn", "--soc", "SM0000"],
                       "--soc SM0000: ExecuTorch's QNN backend knows"),
    "--compile for another backend": (["report", "{block}", "--compile", "--backend", "aten"],
                                      "--compile lowers with QNN's compiler: use --backend qnn"),
    "--precision without --compile": (["report", "{block}", "--precision", "16a8w"],
                                      "--precision is for QNN: add --compile"),
    "--soc and --precision without --compile": (["report", "{block}", "--soc", "SM8750", "--precision", "fp16"],
                                                "--soc and --precision are for QNN: add --compile"),
    "-o not a .pte": (["lower", "{block}", "-o", "out.bin", "--backend", "qnn"], "must end in .pte"),
    "bfloat16 for QNN": (["lower", "{block}", "-o", "{out}", "--backend", "qnn", "--dtype", "bfloat16"],
                         "--dtype bfloat16 with --backend qnn: QNN's HTP computes no bfloat16"),
    "bfloat16 for --compile": (["report", "{block}", "--compile", "--dtype", "bfloat16"],
                               "--dtype bfloat16 with --compile: QNN's HTP computes no bfloat16"),
}


@pytest.mark.parametrize("case", USAGE_CASES)
def test_qnn_usage_errors_exit_2_with_what_to_fix(case, block, tmp_path, capsys):
    argv, message = USAGE_CASES[case]
    out = tmp_path / "out.pte"
    assert cli.main([a.format(block=block, out=out) for a in argv]) == USAGE
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_an_unknown_soc_lists_the_socs_executorch_knows(block, tmp_path, capsys):
    assert cli.main(["lower", block, "-o", str(tmp_path / "o.pte"), "--backend", "qnn", "--soc", "SM0000"]) == USAGE
    err = capsys.readouterr().err
    assert "SM8650" in err and "SM8750" in err and "UNKNOWN_SM" not in err


@pytest.mark.parametrize("argv", [["lower", "m.py:f", "-o", "o.pte", "--backend", "qnn", "--precision", "fp8"],
                                  ["lower", "m.py:f", "-o", "o.pte", "--backend", "npu"]])
def test_argparse_rejects_an_unknown_precision_or_backend(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == USAGE
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.slow
def test_missing_qnn_libraries_exit_3_naming_the_set_up_and_write_nothing(block, tmp_path):
    empty = tmp_path / "no-sdk"
    empty.mkdir()
    env = {**os.environ, "QNN_SDK_ROOT": str(empty), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = tmp_path / "out.pte"
    done = subprocess.run(
        [sys.executable, "-m", "edgefuse", "-q", "lower", block, "--backend", "qnn", "-o", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert done.returncode == UNAVAILABLE, done.stderr
    assert "edgefuse qnn setup" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# --- the models the QNN table lowers ----------------------------------------------------------------------

#: Norms per model: ExecuTorch's Llama has one layer (attention and FFN norms, the final norm, q and k
#: norms with QK norm); the decoder layers have their family's norms.
NORMS = {
    "et-llama-hd32": 3, "et-llama-qk-hd32": 5, "et-llama-hd64": 3, "et-llama-qk-hd64": 5,
    "tiny-llama-layer": 2, "tiny-qwen3-layer": 4, "tiny-gemma3-layer": 6, "tiny-olmo2-layer": 4, "tiny-t5-layer": 2,
    **{name: 0 for name in QNN_MODEL_NAMES if name.startswith("whole-")},
}
#: The norms a model writes whole (``aten.rms_norm`` in its capture): the input norm and the QK norms.
WHOLE = {name: 3 for name in QNN_MODEL_NAMES if name.startswith("whole-")}


def test_every_qnn_model_has_a_norm_count():
    assert set(NORMS) == set(QNN_MODEL_NAMES)


@pytest.mark.parametrize("name", QNN_MODEL_NAMES)
def test_each_qnn_model_runs_exports_and_holds_its_norms(name):
    module, inputs = build_qnn_model(name)
    with torch.no_grad():
        out = module(*inputs)
    assert torch.isfinite(out).all()
    program = torch.export.export(module, inputs)
    whole = [n for n in program.graph.nodes if n.target is torch.ops.aten.rms_norm.default]
    result = recompose_rms_norm(program.module(), backend="aten", quantization_capture=True)
    assert len(result.decisions) == NORMS[name], [d.module_path for d in result.decisions]
    assert len(whole) == WHOLE.get(name, 0)


def test_the_et_llama_head_dim_and_qk_norms_are_what_the_name_says():
    for name, heads, qk in (("et-llama-hd32", 4, False), ("et-llama-qk-hd64", 2, True)):
        module, _ = build_qnn_model(name)
        attention = module.model.layers[0].attention
        assert attention.n_heads == heads and attention.head_dim == 128 // heads
        assert hasattr(attention, "q_norm_fn") == qk


def test_a_decoder_layer_takes_its_mask_and_rotary_embedding_as_inputs():
    module, (hidden, mask, cos, sin) = build_qnn_model("tiny-qwen3-layer")
    assert mask.shape == (1, 1, 16, 16) and mask[0, 0, 0, 1] <= -60 and mask[0, 0, 1, 0] == 0
    with torch.no_grad():
        causal = module(hidden, mask, cos, sin)
        future = hidden.clone()
        future[:, -1] += 1.0  # only the last position may see the last token
        changed = module(future, mask, cos, sin)
    assert torch.equal(causal[:, :-1], changed[:, :-1])
    assert not torch.equal(causal[:, -1], changed[:, -1])


def test_the_qnn_models_are_built_in_model_names(capsys):
    assert cli.main(["report", "tiny-nope"]) == USAGE
    err = capsys.readouterr().err
    assert all(name in err for name in QNN_MODEL_NAMES)


# --- reading what QNN built -------------------------------------------------------------------------------

def test_a_norm_is_rms_norm_when_its_module_holds_one_in_qnn():
    assert describe_norm([(QNN_BACKEND, "RmsNorm")]) == "RmsNorm"
    assert describe_norm([(QNN_BACKEND, "Reshape"), (QNN_BACKEND, "RmsNorm")]) == "RmsNorm (and Reshape)"
    decomposed = [(QNN_BACKEND, op) for op in ("ElementWisePower", "ReduceMean", "ElementWiseAdd",
                                               "ElementWiseRsqrt", "ElementWiseMultiply", "ElementWiseMultiply")]
    assert describe_norm(decomposed) == (
        "6 QNN ops: 2× ElementWiseMultiply, ElementWisePower, ReduceMean, ElementWiseAdd, ElementWiseRsqrt"
    )
    assert describe_norm([("outside", "mean.dim"), (QNN_BACKEND, "ElementWiseRsqrt")]) == (
        "1 QNN ops: ElementWiseRsqrt; 1 op outside QNN: mean.dim"
    )
    assert describe_norm([]) == "not found in the lowered program"


#: What :func:`qnn_flows.norm_ops` returns in the tests below: the QNN ops of each norm module.
FAKE_OPS: dict = {}


@pytest.fixture
def fake_norm_ops(monkeypatch):
    FAKE_OPS.clear()
    monkeypatch.setattr(qnn_flows, "norm_ops", lambda lowered: FAKE_OPS)


def _program(decisions: list[Decision], error=1e-3, allowed=2e-3) -> QnnProgram:
    """An edgefuse fp16 program whose lowering is faked (its norms' QNN ops are FAKE_OPS)."""
    lowered = SimpleNamespace(decisions=decisions, runs=[], graphs=SimpleNamespace(rms_norms=0))
    within = error is not None and error <= allowed
    return QnnProgram("edgefuse", "fp16", "SM8650", lowered=lowered, error=error, allowed=allowed, within=within)


def _decision(path: str, rebuilt: bool = True) -> Decision:
    return Decision(mean=f"mean_{path}", module_path=path, form="rsqrt", rebuilt=rebuilt,
                    reason="rebuilt" if rebuilt else "left")


def test_failures_name_a_rebuilt_norm_that_is_not_one_rms_norm(fake_norm_ops):
    FAKE_OPS.update({"a": [(QNN_BACKEND, "RmsNorm")], "b": [(QNN_BACKEND, "ReduceMean"), (QNN_BACKEND, "ElementWiseRsqrt")]})
    program = _program([_decision("a"), _decision("b"), _decision("c", rebuilt=False)])
    assert failures(program) == ["rebuilt but not one QNN RmsNorm: b (2 QNN ops: ReduceMean, ElementWiseRsqrt)"]
    FAKE_OPS["b"] = [(QNN_BACKEND, "RmsNorm")]
    assert failures(program) == []


def test_two_rebuilt_norms_of_one_module_need_two_rms_norms(fake_norm_ops):
    FAKE_OPS.update({"a": [(QNN_BACKEND, "RmsNorm"), (QNN_BACKEND, "ReduceMean")]})
    program = _program([_decision("a"), _decision("a")])
    assert failures(program) and "a (" in failures(program)[0]


def test_failures_name_an_error_over_tolerance_and_a_program_that_did_not_run(fake_norm_ops):
    assert failures(_program([], error=3e-3, allowed=2e-3)) == [
        "the edgefuse program differs from eager by 3.00e-03, more than the allowed 2.00e-03"
    ]
    not_run = _program([], error=None, allowed=None)
    not_run.failure = "RuntimeError: Failed to load method forward"
    assert failures(not_run) == ["the edgefuse program did not run on the emulator: RuntimeError: Failed to load method forward"]
    unlowered = QnnProgram("edgefuse", "fp16", "SM8650", failure="QNN could not lower the model")
    assert failures(unlowered) == ["the edgefuse lowering failed: QNN could not lower the model"]


# --- report --compile: the column, the summary line and the JSON -------------------------------------------

def test_a_compiled_report_has_a_qnn_op_column_a_line_and_json_that_validates(block):
    from edgefuse.inputs.modelspec import resolve
    from edgefuse.compare.report import build_report, format_report, schema, to_json

    report = build_report(resolve(block), backend="qnn", stage="edge")
    (row,) = report.rows
    assert row.decision.rebuilt
    report.compiled, report.rms_norms = "QNN SM8650 fp16", 0
    row.compiled = "6 QNN ops: 2× ElementWiseMultiply, ElementWisePower, ReduceMean, ElementWiseAdd, ElementWiseRsqrt"
    text = format_report(report)
    header, cells = text.splitlines()[1:3]
    assert header.split()[-3:] == ["QNN", "op", "reason"]  # the op before the reason, which runs long
    assert cells.endswith(f"{row.compiled}  rebuilt")
    assert text.splitlines()[-1].startswith(
        "compiled for QNN SM8650 fp16: 0 of 1 norms are one QNN RmsNorm; 0 RmsNorm in the QNN program; "
        "rebuilt here but not one RmsNorm there: "
    )
    data = to_json(report)
    jsonschema.validate(data, schema())
    assert data["compiled"] == {"target": "QNN SM8650 fp16", "rms_norms": 0}
    assert data["norms"][0]["compiled"] == row.compiled
    row.compiled, report.rms_norms = "RmsNorm", 1
    assert format_report(report).splitlines()[-1] == (
        "compiled for QNN SM8650 fp16: 1 of 1 norms are one QNN RmsNorm; 1 RmsNorm in the QNN program"
    )


def test_a_report_without_compile_has_no_compiled_fields(block):
    from edgefuse.inputs.modelspec import resolve
    from edgefuse.compare.report import build_report, format_report, to_json

    report = build_report(resolve(block), backend="qnn", stage="edge")
    assert "QNN op" not in format_report(report) and "compiled" not in to_json(report)
    assert all("compiled" not in norm for norm in to_json(report)["norms"])
