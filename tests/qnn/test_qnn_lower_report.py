"""The QNN commands for real: ``lower --backend qnn`` and ``report --compile`` compile with QNN, run on
the x86 HTP emulator and compare; the model table runs one small row. Each test needs the QNN
libraries (the ``qnn_sdk`` fixture skips it, naming ``edgefuse qnn setup``, where they are not set up)."""

from __future__ import annotations

import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest
import torch

from edgefuse import cli
from edgefuse.tools import qnn_check
from edgefuse.compare import qnn_flows
from edgefuse.inputs.errors import CHECK_FAILED, OK, USAGE
from tests.cli.command_runs import MODELS_PY as COMMAND_MODELS_PY

pytestmark = pytest.mark.slow

#: The command tests' models (Hugging Face Llama's norm ``Norm`` among them), a Linear -> norm -> Linear
#: block, and a model QNN cannot compile: a whole transformers Llama, whose mask code becomes a QNN graph
#: with no input ("No graph inputs present for graph [0]").
MODELS_PY = COMMAND_MODELS_PY + textwrap.dedent(
    '''


    class LinearBlock(nn.Module):
        def __init__(self, width=32):
            super().__init__()
            self.a, self.norm, self.b = nn.Linear(width, width), Norm(width), nn.Linear(width, width)

        def forward(self, x):
            return self.b(self.norm(self.a(x))) * 0.5


    def linear_block():
        torch.manual_seed(0)
        return LinearBlock(), (torch.randn(1, 8, 32),)


    class InlineNorm(nn.Module):
        """Linear -> a norm written in the model's own forward -> Linear."""

        def __init__(self, width=32):
            super().__init__()
            self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

        def forward(self, x):
            h = self.a(x)
            return self.b(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


    def inline_norm():
        torch.manual_seed(0)
        return InlineNorm(), (torch.randn(1, 8, 32),)


    class WholeNorm(nn.Module):
        """Linear -> nn.RMSNorm, which QNN's flow keeps whole (no decision) -> Linear."""

        def __init__(self, width=32):
            super().__init__()
            self.a, self.norm, self.b = nn.Linear(width, width), nn.RMSNorm(width, eps=1e-6), nn.Linear(width, width)

        def forward(self, x):
            return self.b(self.norm(self.a(x)))


    def whole_norm():
        torch.manual_seed(0)
        return WholeNorm(), (torch.randn(1, 8, 32),)


    def whole_llama():
        from edgefuse.inputs.models import build_model

        return build_model("tiny-llama", layers=1)
    '''
)
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def models(tmp_path_factory, qnn_sdk):
    path = tmp_path_factory.mktemp("qnn_commands")
    (path / "models.py").write_text(MODELS_PY)
    return path


@pytest.mark.parametrize("precision, reference", [("fp16", "eager"), ("16a8w", "the fake-quantized module")])
def test_lower_qnn_writes_a_pte_that_runs_and_a_map_of_the_qnn_delegate(models, precision, reference, capsys):
    out = models / f"block-{precision}.pte"
    code = cli.main(["-q", "lower", f"{models / 'models.py'}:linear_block", "--backend", "qnn", "--precision", precision,
                     "-o", str(out)])
    stdout = capsys.readouterr().out
    assert code == OK, stdout
    lines = stdout.splitlines()
    assert lines[0].endswith(f"QNN HTP SM8650 {precision}, edgefuse and stock:")
    ours, stock = lines[1].strip(), lines[2].strip()
    assert ours.startswith("edgefuse: 1 of 1 norms rebuilt, 1 RmsNorm in QNN; 1 delegate, 0 ops outside; ")
    assert f"max error against {reference} " in ours and "(within " in ours
    assert stock.startswith("stock: 1 RmsNorm in QNN; ") and "max error against" in stock
    assert ("against float eager" in ours) == (precision != "fp16")
    assert "QNN_DATATYPE" not in stdout  # QNN's native op tables stay off stdout

    # the .pte written is a program of the model that was checked: on the emulator it gives, bit for bit,
    # what edgefuse.qnn.lower's program of the same model gives
    from edgefuse.qnn import lower, run_on_emulator

    module, inputs = _block(models)
    checked = lower(module, inputs, precision=precision)
    rerun = run_on_emulator(out.read_bytes(), list(inputs))
    again = run_on_emulator(checked.to_pte(), list(inputs))
    assert len(rerun) == len(again) == 1 and torch.equal(rerun[0], again[0])

    svg = ET.parse(models / f"block-{precision}.delegates.svg").getroot()
    labels = [g.get("data-label") for g in svg.iter(f"{SVG}g") if g.get("class") == "program"]
    assert labels == ["stock", "edgefuse"]
    delegates = [g for g in svg.iter(f"{SVG}g") if g.get("class") == "delegate"]
    assert len(delegates) == 2  # one per program
    for delegate in delegates:  # named by its backend, with the QNN ops it compiled
        assert delegate.find(f"{SVG}text").text.startswith("QnnBackend #0 · ")
        assert "RmsNorm" in delegate.find(f"{SVG}title").text.split(", ")


def _block(models):
    import importlib.util

    spec = importlib.util.spec_from_file_location("qnn_commands_models", models / "models.py")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded  # torch.export reads the model's source through its module
    spec.loader.exec_module(loaded)
    module, inputs = loaded.linear_block()
    return module.eval(), inputs


def test_report_compile_says_which_qnn_op_each_norm_became(models, capsys):
    code = cli.main(["-q", "report", f"{models / 'models.py'}:linear_block", "--compile"])
    stdout = capsys.readouterr().out
    assert code == OK, stdout
    header, row = stdout.splitlines()[1:3]
    assert "QNN op" in header
    assert row.split()[1] == "norm" and " RmsNorm" in row
    assert "compiled for QNN SM8650 fp16: 1 of 1 norms are one QNN RmsNorm; 1 RmsNorm in the QNN program" in stdout


@pytest.mark.parametrize("model", ["linear_block", "whole_norm"])
def test_report_compile_says_a_quantized_rms_norm_rounds_to_nearest(models, model, capsys):
    """A norm rebuilt (linear_block's) has its decision's place; an nn.RMSNorm reaches QNN whole, with no
    decision of QNN's flow (whole_norm's): its rounding is read from its op."""
    code = cli.main(["-q", "report", f"{models / 'models.py'}:{model}", "--compile", "--precision", "16a8w"])
    stdout = capsys.readouterr().out
    assert code == OK, stdout
    row = stdout.splitlines()[2]
    assert row.split()[1] == "norm" and " RmsNorm, output rounds to nearest" in row
    assert "compiled for QNN SM8650 16a8w: 1 of 1 norms are one QNN RmsNorm" in stdout


def test_a_model_qnn_cannot_lower_exits_2_with_qnns_reason_and_writes_nothing(models, capsys):
    out = models / "llama.pte"
    code = cli.main(["-q", "lower", f"{models / 'models.py'}:whole_llama", "--backend", "qnn", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert "QNN could not lower the model for SM8650 at fp16" in err
    assert "QNN logged: " in err and "No graph inputs present for graph [0]" in err.split("QNN logged: ")[1]
    assert "no .pte was written" in err
    assert not out.exists() and not list(models.glob("*.tmp"))


def test_lower_qnn_exits_1_when_edgefuses_program_is_outside_its_tolerance(models, monkeypatch, capsys):
    monkeypatch.setattr(qnn_flows, "FP16_ULPS", 0)  # any rounding at all is now too much
    code = cli.main(["-q", "lower", f"{models / 'models.py'}:linear_block", "--backend", "qnn", "-o", str(models / "tight.pte")])
    stdout = capsys.readouterr().out
    assert code == CHECK_FAILED, stdout
    assert "check failed: the edgefuse program differs from eager by " in stdout
    assert "(OUTSIDE " in stdout


def test_the_qnn_table_passes_one_small_row(qnn_sdk, capsys):
    code = qnn_check.main(["-q", "--models", "tiny-llama-layer", "--precisions", "fp16"])
    stdout = capsys.readouterr().out
    assert code == OK, stdout
    rows = [line.split() for line in stdout.splitlines() if line.startswith("tiny-llama-layer")]
    assert [row[2] for row in rows] == ["edgefuse", "stock"]
    ours = rows[0]
    # 2 norms found and rebuilt, none viewed for a limit, 2 RmsNorm in QNN
    assert ours[3:7] == ["2", "2", "0", "2"] and ours[qnn_check.HEADER.index("result")] == "PASS"
    assert stdout.rstrip().endswith("all passed")


def test_a_masked_layer_at_16a8w_is_within_its_derived_tolerance(qnn_sdk):
    """OLMo 2's layer quantized 16a8w matches the fake-quantized module at its derived tolerance (one
    output step per rounding on its longest path, or what the module carries, whichever is more). The
    mask sets the range of the scores it is added to: with -1e4 (the mask this table had) their 16-bit
    step was 0.15 and the program 1178 output steps off; with the table's mask it is 9e-4 and the program
    19 steps off, of the 22 its roundings allow, within a tolerance tighter than float16's."""
    from edgefuse.inputs.qnn_models import build_qnn_model

    module, inputs = build_qnn_model("tiny-olmo2-layer")
    program = qnn_flows.lower_qnn(module, inputs, qnn_flows.EDGEFUSE, soc="SM8650", precision="16a8w")
    qnn_flows.run_and_check(program, module, inputs)
    assert program.ok, program.line()
    assert program.told_apart  # no looser than float16's bound on the same output
    assert program.roundings.coarsest < 10 * program.step  # no step on the way dwarfs the output's
    with torch.no_grad():  # the module's own distance from float eager, beside the program's
        quantization = float((program.lowered.reference(*inputs) - module(*inputs)).abs().max())
    assert program.module_float_error == pytest.approx(quantization, rel=1e-6) and quantization > 0
    with torch.no_grad():  # the mean distances of its one output from its module and from float eager
        away = (program.outputs[0] - program.lowered.reference(*inputs)).abs()
        assert program.mean_error == pytest.approx(float(away.mean()), rel=1e-6)
        assert program.mean_error < program.error == pytest.approx(float(away.max()), rel=1e-6)
        assert program.mean_float_error == pytest.approx(float((program.outputs[0] - module(*inputs)).abs().mean()), rel=1e-6)
    from edgefuse.qnn.emulator import rms_norm_roundings, rounding_down

    fake = program.lowered.reference  # the program against its module with each norm's output rounding down
    down = rounding_down(fake, rms_norm_roundings(fake))(*inputs)[0]
    assert program.rounding_down_error == pytest.approx(float((down - program.outputs[0]).abs().max()), rel=1e-6)
    assert program.rounding_down_mean_error == pytest.approx(float((down - program.outputs[0]).abs().mean()), rel=1e-6)


def test_a_quantized_tolerance_looser_than_float16s_does_not_tell_a_program_apart():
    """export_llm's Llama at 16a4w, with its -inf mask, was allowed 0.68 on logits of about 3 (measured on
    QNN 2.51's emulator) where float16 allows 8 units in its last place at 3 (2^-9 each): 0.016."""
    logits = torch.tensor([3.0, -1.0, 0.5])
    assert not qnn_flows.told_apart(logits, 0.68)
    assert qnn_flows.told_apart(logits, 1e-3)
    program = qnn_flows.QnnProgram("edgefuse", "16a8w", "SM8650", lowered=object(), error=0.1, allowed=0.68,
                                   within=True, told_apart=False)
    assert not program.ok


def test_a_program_that_reads_memory_it_did_not_write_is_marked(qnn_sdk):
    """QNN computes the QK norms of ExecuTorch's Llama (head dim 32) wrong at fp16, and that program's
    outputs change with what another program computed before it; the edgefuse program of the same model,
    run between, gives the same bits each time. A QNN version that fixes the norm shows up here."""
    from edgefuse.inputs.qnn_models import build_qnn_model

    module, inputs = build_qnn_model("et-llama-qk-hd32")
    programs = [
        qnn_flows.run_and_check(qnn_flows.lower_qnn(module, inputs, how, soc="SM8650", precision="fp16"), module, inputs)
        for how in (qnn_flows.EDGEFUSE, qnn_flows.STOCK)
    ]
    qnn_flows.check_repeatable(programs, inputs)
    ours, stock = programs
    assert ours.ok and ours.repeatable is True, ours.line()
    assert not stock.ok and stock.repeatable is False, stock.line()
    assert qnn_flows.VARIES in stock.line()
    assert any(qnn_flows.VARIES in failure for failure in qnn_flows.failures(stock))


def test_a_norm_in_the_models_own_forward_is_found_in_qnns_program(models, capsys):
    code = cli.main(["-q", "report", f"{models / 'models.py'}:inline_norm", "--compile"])
    stdout = capsys.readouterr().out
    assert code == OK, stdout
    assert "1 of 1 norms are one QNN RmsNorm" in stdout, stdout


def test_a_program_alone_is_run_again_after_itself_on_other_values(qnn_sdk):
    # Stock cannot lower a Gemma (1 + w) norm at fp16: edgefuse's program is still run again, after
    # itself on other values, and found to give the same bits.
    from tests.qnn.test_pipeline import Blocks, _inputs  # the block test_stock_cannot_lower_gemma_at_fp16 lowers

    module, inputs = Blocks(("gemma",)).eval(), _inputs()
    programs = [
        qnn_flows.run_and_check(qnn_flows.lower_qnn(module, inputs, how, soc="SM8650", precision="fp16"), module, inputs)
        for how in (qnn_flows.EDGEFUSE, qnn_flows.STOCK)
    ]
    qnn_flows.check_repeatable(programs, inputs)
    ours, stock = programs
    assert not stock.lowered_ok, stock.line()
    assert ours.ok and ours.repeatable is True, ours.line()
