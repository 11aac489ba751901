"""ExecuTorch's static-Llama QNN script (``llama.py``) as edgefuse runs it: offline, on a tiny config the
tests write (one layer, QK norms, head dims 32 and 64, random weights, a SentencePiece tokenizer trained
here on four sentences), compile-only, each method run on the HTP emulator.

The command runs the script once per config for the module (it compiles for about two minutes); the
tests read those runs and the command's report. The script's wrong typing of logits as large as a head
dim (a vocabulary of 64 at head dim 64) is tested on the smallest program that has it: one linear layer
whose 16-bit output is declared ``uint8``.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass

import pytest
import torch

from edgefuse.cli import main

pytestmark = pytest.mark.slow  # compiles the static Llama for QNN and runs it on the emulator

SENTENCES = (
    "once upon a time there was a little fox",
    "the fox ran into the woods and found a red box",
    "a small bird sang a song in the tall tree",
    "she said hello to the sun and the moon",
)
#: The tiny config: Qwen3's QK norms on a model of one layer, two query heads and one key/value head.
PARAMS = dict(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=128, norm_eps=1e-5,
              use_qk_norm=True, qk_norm_before_rope=True, rope_freq_base=10000.0)
#: The vocabulary: no head dim of the tests. The script types its inputs and outputs by their shapes
#: (``_tag_ios`` in its ``llm_wrappers.py``): an output whose last two dims are a KV cache's
#: ``(ar_len, head_dim)`` is kept in the cache's 8 bits, so logits of ``(ar_len, vocab)`` with a vocabulary
#: equal to the head dim are declared ``uint8`` where QNN writes their 16-bit levels.
VOCAB = 48


def write_config(folder, head_dim: int, vocab: int = VOCAB) -> list[str]:
    """The files of a tiny stories260k-style config with ``head_dim`` and a vocabulary of ``vocab`` pieces,
    and the script's arguments for them."""
    import sentencepiece

    from executorch.examples.models.llama.model_args import ModelArgs

    from edgefuse.llm.static_llama import absent_extras

    with absent_extras():
        from executorch.examples.qualcomm.oss_scripts.llama.model.static_llama import LlamaModel

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES), model_prefix=str(folder / "tokenizer"), vocab_size=vocab,
        model_type="bpe", character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )
    params = dict(PARAMS, head_dim=head_dim, vocab_size=vocab)
    (folder / "params.json").write_text(json.dumps(params))
    torch.manual_seed(head_dim)
    model = LlamaModel(ModelArgs(**params), ar_len=1, output_new_cache_only=True, output_cache=True,
                       use_i64_token=False)
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # norms' weights too: not all ones
            parameter.copy_(1.0 + 0.25 * torch.randn_like(parameter) if "norm" in name else 0.1 * torch.randn_like(parameter))
    torch.save(model.state_dict(), folder / "checkpoint.pt")
    (folder / "tokenizer.bin").write_bytes(b"")  # the runner's tokenizer: read only by inference on a phone
    (folder / "calibration.json").write_text(json.dumps([{"messages": [{"role": "user", "content": s}]} for s in SENTENCES]))
    return [
        "--decoder_model", "stories260k", "--checkpoint", str(folder / "checkpoint.pt"),
        "--params", str(folder / "params.json"), "--tokenizer_model", str(folder / "tokenizer.model"),
        "--tokenizer_bin", str(folder / "tokenizer.bin"), "--calib_samples", str(folder / "calibration.json"),
        "--prompt", "once upon a time", "--soc_model", "SM8650", "--model_mode", "hybrid",
        "--max_seq_len", "32", "--prefill_ar_len", "16",
    ]


#: The configs the script is run on, by name: head dim and vocabulary.
CONFIGS = {"hd32": (32, VOCAB), "hd64": (64, VOCAB)}


@dataclass
class CommandRun:
    """The command on one config of :data:`CONFIGS`: its name, exit code and report (stdout), and the
    script's run it made, as :func:`edgefuse.llm.static_llama.run_script` returned it."""

    config: str
    code: int
    out: str
    run: object


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def command_run(request, qnn_sdk, tmp_path_factory) -> CommandRun:
    """``edgefuse qnn-llama --method prefill_forward`` on one config, as a user runs it, its outputs in a
    folder of the test's: the script compiles each config once, and the tests read this run and report."""
    from edgefuse.llm import static_llama

    folder = tmp_path_factory.mktemp(f"llama-{request.param}")
    argv = write_config(folder, *CONFIGS[request.param]) + ["--artifact", str(folder / "artifact")]
    runs = []

    def run_script(args):
        runs.append(original(args))
        return runs[-1]

    original, stdout = static_llama.run_script, io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout):
        patch.setattr(static_llama, "run_script", run_script)
        code = main(["-q", "qnn-llama", "--method", "prefill_forward", *argv])
    (run,) = runs
    return CommandRun(request.param, code, stdout.getvalue(), run)


@pytest.fixture
def script_run(command_run):
    """The script's run on one config (its name and the run)."""
    return command_run.config, command_run.run


@pytest.mark.slow
def test_compile_only_writes_a_program_of_a_prefill_and_a_decode(script_run):
    _, run = script_run
    written = sorted(p for p in __import__("pathlib").Path(run.artifact).iterdir() if p.suffix == ".pte")
    assert len(written) == 1 and written[0].read_bytes() == run.pte
    assert sorted(run.methods) == ["kv_forward", "prefill_forward"]
    assert run.methods["prefill_forward"].inputs[0].shape == (1, 16)
    assert run.methods["kv_forward"].inputs[0].shape == (1, 1)


#: What QNN 2.51's HTP emulator makes of each method of each config, measured: both methods match their
#: fake-quantized modules at head dims 32 and 64. A QNN, a script or an edgefuse that changes one fails
#: this test, and the entry is measured again.
MEASURED = {
    "hd32": {"kv_forward": "matches", "prefill_forward": "matches"},
    "hd64": {"kv_forward": "matches", "prefill_forward": "matches"},
}


def outcome(check) -> str:
    if check.failure is not None:
        return "crashes" if "the runtime crashed" in check.failure else check.failure.split("; QNN reads")[0]
    return "matches" if check.ok else "off"


@pytest.mark.slow
def test_each_method_runs_on_the_emulator_against_its_fake_quantized_module(script_run):
    from edgefuse.llm.static_llama import check_method

    config, run = script_run
    checks = {name: check_method(run, name) for name in run.methods}
    assert {name: outcome(check) for name, check in checks.items()} == MEASURED[config]
    for check in checks.values():
        if check.failure is None:  # the logits are quantized: compared at their quantization steps
            assert len(check.comparisons) == 3 and check.tolerances[0] is not None


@pytest.fixture(scope="module")
def logits_declared_uint8(qnn_sdk):
    """The script's run of a vocabulary equal to the head dim, on the smallest program that has what it
    did to the logits: one ``nn.Linear(64, 64)`` quantized 16a8w, lowered for SM8650 with the QNN backend's
    own ``TagQuantIO`` declaring every placeholder (the input, and the lifted weight and bias) ``uint16`` and
    the output ``uint8``, and written as the script writes its program (``BuildQuantIo``, inputs and outputs
    not planned). A :class:`edgefuse.llm.static_llama.ScriptRun` of its one method, ``forward``: its test
    holds edgefuse's refusal to run the method, not the crash running it ends in (docs/qnn-llama.md)."""
    import argparse

    from executorch.backends.qualcomm._passes.build_quant_io import BuildQuantIo
    from executorch.backends.qualcomm._passes.qnn_pass_manager import QnnPassManager
    from executorch.backends.qualcomm._passes.tag_quant_io import TagQuantIO
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset, QnnExecuTorchBackendType
    from executorch.backends.qualcomm.utils.constants import QCOM_PASS_ACTIVATE_KEY, QCOM_PASS_ARGS_KWARGS_DEFAULTS_KEY
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        get_qnn_context_binary_alignment,
        to_edge_transform_and_lower_to_qnn,
    )
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgefuse.llm.static_llama import Method, ScriptRun

    torch.manual_seed(0)
    module, x = torch.nn.Linear(64, 64).eval(), torch.randn(1, 16, 64)
    quantizer = QnnQuantizer(backend=QnnExecuTorchBackendType.kHtpBackend, soc_model=QcomChipset.SM8650)
    quantizer.set_default_quant_config(QuantDtype.use_16a8w)
    prepared = prepare_pt2e(torch.export.export(module, (x,)).module(), quantizer)
    prepared(x)
    converted = convert_pt2e(prepared)

    def declared(node):  # the input in its levels' type, as the script declares its own; the output uint8
        if node.op == "placeholder":
            return torch.uint16
        return torch.uint8 if any(user.op == "output" for user in node.users) else None

    passes = QnnPassManager.get_capture_program_passes()
    passes[TagQuantIO][QCOM_PASS_ACTIVATE_KEY] = True
    passes[TagQuantIO][QCOM_PASS_ARGS_KWARGS_DEFAULTS_KEY]["get_quant_io_dtype_fn"] = declared
    specs = generate_qnn_executorch_compiler_spec(
        soc_model=QcomChipset.SM8650, backend_options=generate_htp_compiler_spec(use_fp16=False))
    edge = to_edge_transform_and_lower_to_qnn(converted, (x,), specs, passes_job=passes)
    pte = edge.to_executorch(ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False),
        passes=[BuildQuantIo()], segment_alignment=get_qnn_context_binary_alignment())).buffer
    return ScriptRun(argparse.Namespace(), "", pte, {"forward": Method("forward", converted, (x,))}, edge)


@pytest.mark.slow
def test_a_method_declaring_its_16_bit_logits_uint8_is_not_run(logits_declared_uint8):
    """Run so, QNN writes the output's 16-bit levels, 2048 bytes, into the 1024-byte buffer the runtime
    sizes by the declaration, and the process ends when the method is freed (docs/qnn-llama.md)."""
    from edgefuse.llm.static_llama import check_method

    check = check_method(logits_declared_uint8, "forward")
    assert check.failure == (
        "not run: the program's output 0 is declared uint8 [1, 16, 64] (1024 bytes) where its module's levels "
        "are uint16 (2048 bytes); QNN reads and writes the levels it was compiled with, past the buffers the "
        "runtime sizes by the declared types")
    assert not check.ok and check.comparisons == []


@pytest.mark.slow
def test_rms_norms_are_counted_per_method(script_run):
    """Each method's graph holds every norm of the model as a QNN RmsNorm: the layer's two, the last one, and
    the QK norms, which the script's MHA-to-SHA split gives one per head (two query heads, one key head)."""
    from edgefuse.llm.static_llama import check_method

    _, run = script_run
    per_layer = 2 + PARAMS["n_heads"] + PARAMS["n_kv_heads"]
    expected = PARAMS["n_layers"] * per_layer + 1
    by_method = run.graphs.methods()
    assert sorted(by_method) == ["kv_forward", "prefill_forward"]
    for name, graphs in by_method.items():
        assert sum(g.rms_norms for g in graphs) == expected, name
        assert check_method(run, name).rms_norms == expected


@pytest.mark.slow
def test_each_method_is_paired_with_its_own_recomposition(script_run):
    """Every norm of this model is whole (``torch.nn.RMSNorm``): each method's to_edge recomposition ran and
    decided nothing, and the two runs pair up with the two methods."""
    from edgefuse.llm.static_llama import decisions_by_method

    _, run = script_run
    assert decisions_by_method(run) == {"kv_forward": [], "prefill_forward": []}


@pytest.mark.slow
def test_the_norms_are_held_to_the_limits_of_the_scripts_soc(script_run):
    """``--soc_model SM8650`` reaches :func:`edgefuse.qnn.patched`: the limits are V75's, as measured there."""
    _, run = script_run
    assert run.patch.note == "the limits of V75, measured on SM8650"


@pytest.mark.slow
def test_a_method_the_program_lacks_is_refused_naming_its_methods(script_run):
    from edgefuse.llm.static_llama import check_method
    from edgefuse.runtime import MethodMissing

    _, run = script_run
    with pytest.raises(MethodMissing, match="no method 'forward'; its methods: kv_forward, prefill_forward"):
        check_method(run, "forward")


@pytest.fixture(scope="module")
def config_args(tmp_path_factory, qnn_sdk) -> list[str]:
    folder = tmp_path_factory.mktemp("llama-args")
    return write_config(folder, 32)


def test_the_command_refuses_a_method_the_script_does_not_make(config_args, capsys):
    code = main(["-q", "qnn-llama", "--method", "forward", *config_args])
    assert code == 2
    assert "--method forward: the script's program for --model_mode hybrid has the methods kv_forward, prefill_forward" in capsys.readouterr().err


def test_the_command_refuses_a_soc_qnn_does_not_compile_for(config_args, capsys):
    args = [a if a != "SM8650" else "SM0000" for a in config_args]
    code = main(["-q", "qnn-llama", *args])
    assert code == 2
    err = capsys.readouterr().err
    assert "--soc_model SM0000: ExecuTorch's QNN backend compiles for" in err and "SM8650" in err


def test_the_command_refuses_what_the_script_refuses(config_args, capsys):
    code = main(["-q", "qnn-llama", *[a for a in config_args if a not in ("--decoder_model", "stories260k")]])
    assert code == 2
    assert "llama.py: the following arguments are required: --decoder_model" in capsys.readouterr().err


def test_a_package_the_run_lacks_is_named_when_the_script_uses_it(monkeypatch):
    import importlib

    from edgefuse.llm import static_llama

    monkeypatch.setitem(static_llama.EXTRAS, "edgefuse_absent_package", "a test")
    script_module = {"__name__": "executorch.examples.qualcomm.edgefuse_test"}  # an import the script makes
    with static_llama.absent_extras():
        exec("from edgefuse_absent_package.models import simple_evaluate", script_module)
    evaluate = script_module["simple_evaluate"]
    with pytest.raises(static_llama.ExtraMissing, match="install edgefuse_absent_package .the script uses it for a test"):
        evaluate()
    with pytest.raises(static_llama.ExtraMissing, match="install edgefuse_absent_package"):
        bool(evaluate)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("edgefuse_absent_package")


def test_a_package_the_run_lacks_gets_no_stand_in_for_imports_from_outside_the_script(monkeypatch):
    """An import from outside the script's modules, as torch's ``try: import pydot``
    (``torch.fx.passes.graph_drawer``), finds a missing package missing while the script loads."""
    import importlib.util

    from edgefuse.llm import static_llama

    monkeypatch.setitem(static_llama.EXTRAS, "edgefuse_absent_package", "a test")
    with static_llama.absent_extras():
        assert importlib.util.find_spec("edgefuse_absent_package") is None
        with pytest.raises(ImportError):
            exec("import edgefuse_absent_package", {"__name__": "torch.fx.passes.graph_drawer"})
        static_llama._script()  # loading the script changes nothing for the rest of the process
        assert importlib.util.find_spec("edgefuse_absent_package") is None


def test_the_command_prints_what_the_legalize_pass_did_beside_the_decisions(capsys):
    """Each pipeline run's legalized norms are printed under its decisions: kept, viewed or left, with the reason."""
    from types import SimpleNamespace

    from edgefuse.cli.qnn_llama import _print_decisions
    from edgefuse.core.legalize import KEPT, VIEWED, Legalized
    from edgefuse.qnn import PassRun

    legalized = (
        Legalized("rms_norm", "layers.0.attention_norm", (1, 16, 64), KEPT, "no limit of qnn covers [1, 16, 64] in fp16"),
        Legalized("rms_norm_1", None, (2, 16, 64), VIEWED, "normalized on a [1, 32, 64] view of its input", "htp-fp16-rms-norm-layout"),
    )
    _print_decisions(SimpleNamespace(patch=SimpleNamespace(runs=[PassRun("to_edge", "RecomposeRmsNorm", legalized=legalized)])))
    out = capsys.readouterr().out
    assert "norms decided: 0; whole norms held to the limits: 2" in out
    assert "  to_edge: layers.0.attention_norm (whole norm): kept, no limit of qnn covers [1, 16, 64] in fp16" in out
    assert "  to_edge: rms_norm_1 (whole norm): viewed, normalized on a [1, 32, 64] view of its input" in out


def test_the_command_refuses_an_artifact_folder_others_could_write(config_args, tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    code = main(["-q", "qnn-llama", *config_args, "--artifact", str(shared)])
    assert code == 2
    assert f"--artifact {shared}: " in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_prints_each_method_report_alone_on_stdout(command_run):
    code, out = command_run.code, command_run.out
    assert code == 0, out
    assert "methods kv_forward, prefill_forward" in out
    assert "Finish compile_only" not in out  # the script's own printing goes to stderr
    (row,) = [line.split() for line in out.splitlines() if line.strip().startswith("prefill_forward")]
    whole = PARAMS["n_layers"] * 4 + 1  # per layer its two norms and the two QK norms; the last norm
    per_head = PARAMS["n_layers"] * (2 + PARAMS["n_heads"] + PARAMS["n_kv_heads"]) + 1
    assert row[:2] == ["prefill_forward", "0/0"]
    kept, viewed, left = (int(n) for n in row[2].split("/"))
    assert viewed == left == 0 and kept > 0  # every whole norm of this model is one no limit covers
    assert row[3:6] == [str(whole), str(per_head), "0"]
    assert "whole norm): kept, no limit of qnn covers" in out
    assert row[-1] == "yes" and not any(line.strip().startswith("kv_forward") for line in out.splitlines())
