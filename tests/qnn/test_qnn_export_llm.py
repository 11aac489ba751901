"""``edgefuse export-llm`` for a QNN config: ExecuTorch 1.5.1's own export_llm QNN path with edgefuse's
QNN passes, compiled by QNN and run on the x86 HTP emulator.

The model is ExecuTorch's Llama from small params (dim 64, one layer, random weights saved as a
checkpoint) with a KV cache and static shapes, as export_llm's QNN path requires; SM8650. The full
table, stock beside edgefuse and the quantized configs, is ``python -m edgefuse.tools.llm_qnn_check``.
"""

from __future__ import annotations

import os

import pytest

from edgefuse import cli
from edgefuse.inputs.errors import INTERNAL, USAGE
from edgefuse.tools.llm_qnn_check import CASES, check_case
from edgefuse.llm.lowering import swapped

pytestmark = pytest.mark.slow


def ptes(directory) -> list[str]:
    return sorted(name for _, _, names in os.walk(directory) for name in names if ".pte" in name)


def nothing_patched() -> bool:
    """Every function and pass class an export for QNN swaps is the released one again."""
    import executorch.backends.qualcomm.python.PyQnnManagerAdaptor as adaptor
    from executorch.backends.qualcomm._passes import qnn_pass_manager, recompose_rms_norm, remove_redundancy
    from executorch.backends.qualcomm._passes.backends.htp import qnn_htp_pass_manager
    from executorch.examples.models.llama import export_llama_lib

    from executorch.extension.llm.export.builder import LLMEdgeManager

    from edgefuse.llm.qnn import QNN_LOWERING

    module, name = QNN_LOWERING
    return (
        not hasattr(LLMEdgeManager._get_edge_config, "__wrapped__") and
        not any(swapped().values())
        and getattr(export_llama_lib, name).__module__ == module
        and qnn_pass_manager.RecomposeRmsNorm is recompose_rms_norm.RecomposeRmsNorm
        and qnn_pass_manager.RemoveRedundancy is remove_redundancy.RemoveRedundancy
        and qnn_htp_pass_manager.RemoveRedundancy is remove_redundancy.RemoveRedundancy
        and adaptor.QnnManager.Compile.__name__ != "compile_and_record"
    )


@pytest.fixture(scope="session")
def small_llama(tmp_path_factory):
    from edgefuse.llm.eager import write_small_model

    directory = tmp_path_factory.mktemp("small-llama-qnn")
    return write_small_model(str(directory), CASES["llama-fp16"].params)


def test_every_norm_becomes_one_qnn_rms_norm_and_the_program_matches_eager_on_the_emulator(
    qnn_sdk, tmp_path, monkeypatch
):
    """fp16 on the HTP: the two layer norms and the final norm rebuilt by edgefuse's pass in the to_edge
    pipeline, three RmsNorm ops in the graph QNN compiled, one delegate, and each step's logits within
    the fp16 bound of the eager float32 model (reference: the logits; the norms read the residual stream)."""
    monkeypatch.chdir(tmp_path)  # export_llm writes relative names and hydra its run directory there
    checks = check_case(CASES["llama-fp16"], str(tmp_path), prefill=3, decode=2, lowerings=("edgefuse",))
    ours = checks["edgefuse"]
    assert ours.rebuilt == ours.decisions == ours.rms_norms == 3
    assert dict(ours.contents.delegates) == {"QnnBackend": 1}
    assert ours.within, list(zip(ours.errors, ours.allowed))
    assert nothing_patched()


def test_a_quantized_export_records_that_each_rms_norm_rounds_to_nearest(qnn_sdk, small_llama, tmp_path, monkeypatch):
    """8a8w: the record of export_llm's QNN path says each of the three QNN RmsNorm ops (and each rebuilt
    norm's place) rounds to nearest, as edgefuse's builder built them."""
    from edgefuse.llm.export import run_export_llm
    from edgefuse.qnn.graphs import NEAREST

    monkeypatch.chdir(tmp_path)
    arguments = [*CASES["llama-8a8w"].arguments(*small_llama), f"export.output_name={tmp_path / 'ours.pte'}"]
    graphs = run_export_llm(arguments, lowering="edgefuse").swap.qnn.graphs
    ops = [op for graph in graphs.delegates for op in graph.ops if op.type == "RmsNorm"]
    assert [op.rounding for op in ops] == [NEAREST] * 3
    assert [place.rounding for place in graphs.norms] == [NEAREST] * 3
    assert nothing_patched()


def test_a_failure_in_edgefuses_qnn_pass_is_an_internal_error_with_nothing_left_patched(
    qnn_sdk, small_llama, tmp_path, capsys, monkeypatch
):
    """An error raised in edgefuse's own pass code (here a record built with the wrong type, as a bug would)
    is edgefuse's: exit 4 with the traceback, not QNN's refusal."""
    from edgefuse.qnn import passes

    monkeypatch.setattr(passes, "PassRun", dict)  # dict(pipeline, name, decisions) raises TypeError
    params, checkpoint = small_llama
    monkeypatch.chdir(tmp_path)
    code = cli.main(["-q", "export-llm", *CASES["llama-fp16"].arguments(params, checkpoint),
                     "export.output_name=model.pte"])
    err = capsys.readouterr().err
    assert code == INTERNAL and "dict expected at most 1 argument" in err and "Traceback" in err
    assert ptes(tmp_path) == [] and nothing_patched()


def test_a_failure_in_qnns_lowering_exits_2_with_its_reason_and_nothing_left_patched(
    qnn_sdk, small_llama, tmp_path, capsys, monkeypatch
):
    from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner

    def refuse(self, edge_program):
        raise RuntimeError("QNN refused the graph on purpose")

    monkeypatch.setattr(QnnPartitioner, "partition", refuse)
    params, checkpoint = small_llama
    monkeypatch.chdir(tmp_path)
    code = cli.main(["-q", "export-llm", *CASES["llama-fp16"].arguments(params, checkpoint),
                     "export.output_name=model.pte"])
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert "export_llm's QNN lowering failed" in err and "QNN refused the graph on purpose" in err
    assert "Traceback" not in err
    assert ptes(tmp_path) == [] and nothing_patched()


def test_the_python_api_puts_every_qnn_swap_back_when_the_export_raises(qnn_sdk, small_llama, tmp_path, monkeypatch):
    from edgefuse.llm import export_llm
    from edgefuse.llm.eager import config_from_overrides
    from edgefuse.qnn.passes import QnnRemoveRedundancy

    seen = []

    def fail(self, graph_module):
        seen.append(nothing_patched())
        raise RuntimeError("cast removal failed on purpose")

    monkeypatch.setattr(QnnRemoveRedundancy, "__call__", fail)
    params, checkpoint = small_llama
    config = config_from_overrides([*CASES["llama-fp16"].arguments(params, checkpoint),
                                    f"export.output_name={tmp_path / 'model.pte'}"])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="on purpose"):
        export_llm(config)
    assert seen == [False]  # the pass ran while everything was swapped in
    assert ptes(tmp_path) == [] and nothing_patched()


def test_bench_llm_refuses_a_qnn_program_saying_it_times_programs_of_this_cpu(qnn_sdk, tmp_path, capsys):
    """A program with a QnnBackend delegate runs on the HTP: bench-llm says what it times (exit 2) instead
    of failing to load QNN's libraries in executorch.runtime."""
    import torch

    from edgefuse.qnn import lower

    torch.manual_seed(0)
    program = tmp_path / "qnn.pte"
    program.write_bytes(lower(torch.nn.Linear(8, 8), (torch.randn(1, 8),)).to_pte())
    assert cli.main(["-q", "bench-llm", str(program), str(program)]) == USAGE
    err = capsys.readouterr().err
    assert f"{program} runs on QNN (a QnnBackend delegate)" in err and "XNNPACK and portable kernels" in err
    assert "Traceback" not in err
