"""``edgefuse export-llm`` and ``bench-llm``, and the checks of ``python -m edgefuse.tools.llm_check``.

Exports of ExecuTorch's Llama and Qwen3 from small params (dim 64, one layer, random weights saved as a
checkpoint) are made once per session. The most telling cases run here: float32 Llama, the session's pair
that the latency tool's ``--export-only`` exports through export_llm's engine (``llama_fp32_programs`` of
tests/conftest.py), checked against eager and timed by ``bench-llm``, and bfloat16 Llama with
``enable_bf16``; ``export-llm --compare`` through the command line is the README's line, 8da4w Llama with
ExecuTorch's ``llama_xnnpack.yaml`` (tests/test_readme.py); 8da4w Qwen3 with QK norms is the scale
command's toy run (tests/tools/test_scale.py); every case of ``python -m edgefuse.tools.llm_check`` (each
model in float32, 8da4w and bfloat16) runs there.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from edgefuse import cli
from edgefuse.inputs.errors import OK, USAGE, UsageError
from edgefuse.tools.llm_check import CASES, case_arguments, check_case, check_programs, passed
from edgefuse.llm.lowering import swapped


@contextlib.contextmanager
def inside(directory):
    """Run in ``directory``: export_llm writes relative names and hydra its run directory there."""
    saved = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(saved)


def nothing_swapped() -> bool:
    return not any(swapped().values())


def ptes(directory) -> list[str]:
    return sorted(name for _, _, names in os.walk(directory) for name in names if ".pte" in name)


# -- bad input: exit 2, export_llm's message, no .pte ---------------------------------------------------


@pytest.fixture(scope="session")
def small_llama(tmp_path_factory):
    from edgefuse.llm.eager import write_small_model

    directory = tmp_path_factory.mktemp("small-llama")
    return (directory, *write_small_model(str(directory), CASES["llama-fp32"].params))


@pytest.mark.parametrize(
    "override, message",
    [
        ("foo.bar=1", "override 'foo.bar=1': foo: not a setting of ExecuTorch's LlmConfig"),
        ("model.dtype_override=fp64", "Invalid value 'fp64', expected one of [fp32, fp16, bf16]"),
        ("export.max_context_length=10", "max_context_length of 10 cannot be shorter than max_seq_length of 128"),
        ("base.checkpoint=/nonexistent/checkpoint.pth", "/nonexistent/checkpoint.pth"),
        ("backend.qnn.enabled=True", "Dynamic shape is not supported with coreml or qnn backends"),
    ],
)
def test_a_config_export_llm_rejects_exits_2_with_its_message_and_writes_nothing(
    small_llama, tmp_path, capsys, override, message
):
    directory, params, checkpoint = small_llama
    arguments = [a for a in case_arguments(CASES["llama-fp32"], params, checkpoint)]
    with inside(tmp_path):
        code = cli.main(["-q", "export-llm", "--compare", *arguments, "export.output_name=model.pte", override])
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert message in err and "Traceback" not in err
    assert ptes(tmp_path) == []
    assert nothing_swapped()


#: export_llm's QNN path for the small Llama: KV cache and static shapes, as 1.5.1 requires.
QNN_ARGUMENTS = ("base.model_class=llama3", "model.use_kv_cache=True", "model.enable_dynamic_shape=False",
                 "backend.qnn.enabled=True")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("model.enable_dynamic_shape=True",), "Dynamic shape is not supported with coreml or qnn backends"),
        (("backend.qnn.soc_model=SM9999",), "backend.qnn.soc_model=SM9999: not a SoC QNN knows ("),
        (("quantization.pt2e_quantize=qnn_16a4w", "quantization.qmode=8da4w"),
         "Cannot specify both quantization_mode and pt2e_quantize"),
        (("quantization.pt2e_quantize=qnn_16a8w",), "Invalid value 'qnn_16a8w'"),
    ],
)
def test_a_qnn_config_export_llm_rejects_exits_2_with_its_message_before_lowering(
    small_llama, tmp_path, capsys, overrides, message
):
    """Rejected before the QNN lowering starts, so with or without the QNN libraries: exit 2, the message,
    no .pte, and nothing left swapped (the QNN pass classes included)."""
    from executorch.backends.qualcomm._passes import qnn_pass_manager

    stock = (qnn_pass_manager.RecomposeRmsNorm, qnn_pass_manager.RemoveRedundancy)
    directory, params, checkpoint = small_llama
    with inside(tmp_path):
        code = cli.main(["-q", "export-llm", "--compare", *QNN_ARGUMENTS, f"base.params={params}",
                         f"base.checkpoint={checkpoint}", "export.output_name=model.pte", *overrides])
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert message in err and "Traceback" not in err
    assert ptes(tmp_path) == [] and nothing_swapped()
    assert (qnn_pass_manager.RecomposeRmsNorm, qnn_pass_manager.RemoveRedundancy) == stock


@pytest.mark.parametrize("qnn", [False, True], ids=["xnnpack", "qnn"])
@pytest.mark.parametrize("output, message", [
    ("missing/model.pte", "export.output_name=missing/model.pte: the folder missing does not exist"),
    ("folder.pte", "export.output_name=folder.pte: folder.pte is a directory; name the .pte file to write"),
    ("model", "export.output_name=model (in export.output_dir=missing): the folder missing does not exist"),
])
def test_an_output_path_export_llm_cannot_write_exits_2_before_exporting(
    small_llama, tmp_path, capsys, monkeypatch, qnn, output, message
):
    """Checked before the export, which otherwise fails to write only once it is done; no export starts."""
    from edgefuse.llm import export as llm_export

    def no_export(*args, **kwargs):
        raise AssertionError("the export started")

    monkeypatch.setattr(llm_export, "lowering_for", no_export)
    directory, params, checkpoint = small_llama
    arguments = ([*QNN_ARGUMENTS, f"base.params={params}", f"base.checkpoint={checkpoint}"] if qnn
                 else case_arguments(CASES["llama-fp32"], params, checkpoint))
    (tmp_path / "folder.pte").mkdir()
    with inside(tmp_path):
        code = cli.main(["-q", "export-llm", *arguments, f"export.output_name={output}",
                         *(["export.output_dir=missing"] if output == "model" else [])])
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert message in err and "Traceback" not in err
    assert ptes(tmp_path) == [] and nothing_swapped()


def test_a_single_row_policy_for_a_qnn_config_exits_2_naming_the_qnn_config(small_llama, tmp_path, capsys):
    directory, params, checkpoint = small_llama
    with inside(tmp_path):
        code = cli.main(["-q", "export-llm", "--single-row", "auto", *QNN_ARGUMENTS, f"base.params={params}",
                         f"base.checkpoint={checkpoint}", "export.output_name=model.pte"])
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert "single-row policy 'auto'" in err and "this is a QNN config (backend.qnn.enabled=True)" in err
    assert ptes(tmp_path) == [] and nothing_swapped()


def test_an_option_export_llm_does_not_take_exits_2_before_exporting(tmp_path, capsys):
    with inside(tmp_path):
        code = cli.main(["-q", "export-llm", "--config", str(tmp_path / "missing.yaml")])
    assert code == USAGE and "no such file" in capsys.readouterr().err


@pytest.mark.slow
def test_a_failure_inside_edgefuses_lowering_is_an_internal_error_with_nothing_left_swapped(
    small_llama, tmp_path, capsys, monkeypatch
):
    """The export fails once edgefuse's lowering runs: exit 4 with the traceback, no .pte, and every
    swapped function back, as after a success."""
    from edgefuse.xnnpack.substitute import SubstituteForXnnpack

    def fail(self, graph_module):
        raise RuntimeError("substitution failed on purpose")

    monkeypatch.setattr(SubstituteForXnnpack, "call", fail)
    directory, params, checkpoint = small_llama
    with inside(tmp_path):
        code = cli.main(["-q", "export-llm", *case_arguments(CASES["llama-fp32"], params, checkpoint),
                         "export.output_name=model.pte"])
    err = capsys.readouterr().err
    assert code == 4 and "substitution failed on purpose" in err and "Traceback" in err
    assert ptes(tmp_path) == [] and nothing_swapped()


@pytest.mark.slow
def test_the_python_api_puts_everything_back_when_the_export_raises(small_llama, tmp_path, monkeypatch):
    from edgefuse.llm import export_llm
    from edgefuse.llm.eager import config_from_overrides
    from edgefuse.xnnpack.substitute import RestoreUndelegated

    def fail(self, graph_module):
        raise RuntimeError("restoration failed on purpose")

    monkeypatch.setattr(RestoreUndelegated, "call", fail)
    directory, params, checkpoint = small_llama
    config = config_from_overrides([*case_arguments(CASES["llama-fp32"], params, checkpoint),
                                    f"export.output_name={tmp_path / 'model.pte'}"])
    with pytest.raises(Exception, match="RestoreUndelegated") as raised:  # ExecuTorch's pass manager wraps it
        export_llm(config)
    assert "restoration failed on purpose" in str(raised.value.__cause__)
    assert ptes(tmp_path) == [] and nothing_swapped()


# -- the programs -----------------------------------------------------------------------------------


def llama_fp32_pair(programs) -> tuple[dict[str, str], object]:
    """The paths of the small Llama's float32 pair in the folder of ``llama_fp32_programs`` (tests/conftest.py),
    by lowering, and the export's config (its model files and its context)."""
    import json

    from edgefuse.llm.eager import config_from_overrides
    from edgefuse.tools.llm_latency import dtype_case

    folder, code, out = programs
    assert code == OK, out
    manifest = json.loads((folder / "manifest.json").read_text())
    model = folder / "64x1"
    arguments = [*case_arguments(dtype_case("64x1", "fp32"), str(model / "params.json"), str(model / "checkpoint.pth")),
                 *(f"export.{name}={manifest[name]}" for name in ("max_seq_length", "max_context_length"))]
    paths = {how: str(model / "fp32" / f"{how}.pte") for how in ("stock", "edgefuse")}
    return paths, config_from_overrides(arguments)


@pytest.mark.slow
def test_float32_llama_of_export_llm_matches_eager_with_no_mean_outside(llama_fp32_programs):
    """The small Llama's float32 pair, exported stock and with edgefuse by export_llm's engine (the latency
    tool's ``--export-only``), against eager over a prefill and 12 decode steps. ``export-llm --compare``
    through the command line is the README's line (tests/test_readme.py)."""
    paths, config = llama_fp32_pair(llama_fp32_programs)
    checks = check_programs(CASES["llama-fp32"], paths, config)
    assert checks["stock"].contents.means == 3 and checks["stock"].matches
    assert checks["edgefuse"].contents.means == 0 and checks["edgefuse"].contents.casts == 0
    assert checks["edgefuse"].contents.delegate_count < checks["stock"].contents.delegate_count
    assert len(checks["edgefuse"].errors) == 13  # the prefill and 12 decode steps
    assert passed(checks), [(c.lowering, c.worst) for c in checks.values()]


@pytest.mark.slow
def test_bfloat16_through_the_python_api_keeps_means_and_casts_inside_and_matches_eager_as_stock_does(
    tmp_path_factory
):
    """bfloat16 Llama with ``enable_bf16``, edgefuse's program through the Python API
    (``edgefuse.llm.export_llm``). 8da4w Qwen3 with its QK norms, through the command line's engine, is the
    scale command's toy run (tests/tools/test_scale.py)."""
    directory = tmp_path_factory.mktemp("llama-bf16")
    with inside(directory):
        checks = check_case(CASES["llama-bf16"], str(directory), api=True)
    stock, ours = checks["stock"].contents, checks["edgefuse"].contents
    assert (stock.means, stock.casts) == (3, 20)
    assert (ours.means, ours.casts) == (0, 0)
    assert passed(checks), [(c.lowering, c.worst, max(c.versus_stock)) for c in checks.values()]
    assert nothing_swapped()


@pytest.mark.slow
def test_bench_llm_prints_medians_ratios_and_the_thread_count(llama_fp32_programs, capsys):
    paths, _ = llama_fp32_pair(llama_fp32_programs)
    stock, ours = paths["stock"], paths["edgefuse"]
    code = cli.main(["-q", "bench-llm", stock, ours, "--prefill", "4", "--decode", "2", "--rounds", "2",
                     "--warmup", "0", "--threads", "1", "--runs", "4"])
    out = capsys.readouterr().out.splitlines()
    assert code == OK
    assert "1 thread(s)" in out[0] and "prefill of 4 tokens" in out[0] and "2 decode steps" in out[0]
    assert "4 runs of 2 rounds" in out[0] and "stock first in runs 1, 3, ..." in out[0]
    assert out[1].split() == ["program", "file", "prefill", "ms", "decode", "ms/token", "prefill", "ratio",
                              "decode", "ratio"]
    stock_row, our_row = out[2].split(), out[3].split()
    assert stock_row[0] == "stock" and our_row[0] == "edgefuse"
    assert stock_row[-2:] == ["1.000", "1.000"] and all(float(v) > 0 for v in our_row[2:])
    assert [line.split(":")[0] for line in out[4:8]] == [
        "run 1, stock loaded first", "run 2, edgefuse loaded first", "run 3, stock loaded first",
        "run 4, edgefuse loaded first"]
    assert out[8].startswith("last decode step's logits, largest difference between the programs:")


@pytest.mark.slow
def test_bench_llm_says_when_the_context_is_too_short(llama_fp32_programs, capsys):
    paths, _ = llama_fp32_pair(llama_fp32_programs)
    code = cli.main(["-q", "bench-llm", paths["stock"], paths["edgefuse"],
                     "--prefill", "120", "--decode", "20", "--rounds", "1", "--warmup", "0"])
    assert code == USAGE and "context length" in capsys.readouterr().err


@pytest.mark.slow
def test_a_timed_program_is_the_file_checked_even_when_another_is_put_at_its_name(llama_fp32_programs, tmp_path):
    """bench-llm's programs are loaded from the open file that was checked (its descriptor), not from the
    path again: a file renamed over the name after the check does not reach the runtime."""
    import shutil

    from edgefuse.compare.llm_programs import load_llm_programs, read_llm_program

    paths, _ = llama_fp32_pair(llama_fp32_programs)
    path = str(tmp_path / "program.pte")
    shutil.copyfile(paths["edgefuse"], path)
    checked = read_llm_program(path, 1 << 30)
    (tmp_path / "other.pte").write_bytes(b"not a program")
    os.replace(tmp_path / "other.pte", path)
    (loaded,) = load_llm_programs([(path, checked)], lambda _: None)
    assert loaded.run([torch.zeros((1, 1), dtype=torch.long), torch.tensor([0])])[0].shape[-1] > 1


@pytest.mark.slow
def test_a_program_written_to_after_its_check_is_refused_when_it_loads_or_is_read(llama_fp32_programs, tmp_path):
    """A file written in place after it was checked is refused with the reason when it is loaded or read
    (a profile reads it): the runtime maps the file, so what it runs must be what was checked. The same
    bytes written back with the modification time put back still move the change time, which tells."""
    import shutil

    from edgefuse.compare.llm_programs import load_llm_programs, read_llm_program

    paths, _ = llama_fp32_pair(llama_fp32_programs)
    path = tmp_path / "program.pte"
    shutil.copyfile(paths["edgefuse"], path)
    checked = read_llm_program(str(path), 1 << 30)
    assert checked.read() == path.read_bytes()
    stamp = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(byte)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    with pytest.raises(UsageError, match="written to after it was checked"):
        load_llm_programs([(str(path), checked)], lambda _: None)
    with pytest.raises(UsageError, match="written to after it was checked"):
        checked.read()
    with open(path, "ab") as f:  # and grown: refused as written, not as a file past its bound
        f.write(b"more")
    with pytest.raises(UsageError, match="written to after it was checked"):
        checked.read()


def test_a_checked_program_is_loaded_by_its_open_files_name_not_from_a_copy_of_its_bytes(monkeypatch):
    """Loading maps the checked file (``/dev/fd/N``) rather than handing the runtime its bytes, which it
    would hold beside what its delegates allocate: a bf16 Llama-3.2-1B pair fits in 23 GiB only mapped."""
    from edgefuse import runtime
    from edgefuse.compare import llm_programs

    given = []
    monkeypatch.setattr(llm_programs, "load_llm_kernels", lambda: None)
    monkeypatch.setattr(runtime, "LoadedProgram", lambda pte: given.append(pte))
    with open(__file__, "rb") as f:
        identity = os.fstat(f.fileno())
        llm_programs.load_llm_programs([("p.pte", llm_programs.CheckedPte("p.pte", f, identity))], lambda _: None)
        assert given == [f"/dev/fd/{f.fileno()}"]


@pytest.mark.parametrize("runs, message", [("0", "--runs must be at least 2"), ("3", "--runs 3: give an even number")])
def test_bench_llm_refuses_runs_that_do_not_load_each_program_first_as_often_before_loading(runs, message, capsys):
    code = cli.main(["-q", "bench-llm", "missing.stock.pte", "missing.pte", "--runs", runs])
    assert code == USAGE and message in capsys.readouterr().err


# -- export recipes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe, model", [("PT2E_INT8_STATIC_PER_CHANNEL", "qwen3"), ("BF16", "llama")])
@pytest.mark.slow
def test_a_recipe_keeps_every_mean_inside_and_matches_stock_and_eager(recipe, model):
    """Static int8 on Qwen3: every norm's mean (the QK norms' over ``[B, T, H, D]`` too) reads a dequantized
    square. bfloat16 has no stock recipe: stock's FP32 recipe leaves bfloat16 on portable kernels."""
    from edgefuse.xnnpack.recipes import EdgefuseRecipeType
    from edgefuse.tools.llm_check import check_recipe

    check = check_recipe(EdgefuseRecipeType[recipe], model)
    assert check.stock.means > 0  # stock splits the delegate at the norms
    assert (check.ours.means, check.ours.casts) == (0, 0)
    assert check.ours.delegate_count < check.stock.delegate_count
    assert check.ok, (check.error, check.allowed, check.versus_stock, check.versus_stock_allowed)


def test_bench_llms_ratios_are_the_geometric_mean_of_its_runs_not_of_the_pooled_medians(monkeypatch, capsys):
    """Runs whose decode ratios are 1.1 and 0.9 at different scales (nothing loads: the programs and their
    runs are stand-ins): the table's ratio is their geometric mean, 0.995, where the medians over every
    round would say 1.9 / 2.0 = 0.950."""
    from types import SimpleNamespace

    import torch

    from edgefuse.cli import llm_commands
    from edgefuse.compare import llm_programs
    from edgefuse.llm import latency
    from edgefuse.llm.latency import PrefillDecode, TimedRun
    from edgefuse import runtime

    timings = [([1.0], [1.1]), ([3.0], [2.7])]
    runs = [TimedRun(order, PrefillDecode([[10.0], [10.0]], list(timings[k]), [torch.zeros(2), torch.zeros(2)]))
            for k, order in enumerate(latency.load_orders(2, 2))]
    monkeypatch.setattr(runtime, "set_threads", lambda threads: threads)
    monkeypatch.setattr(llm_programs, "read_llm_program", lambda path, max_bytes: b"")
    monkeypatch.setattr(llm_programs, "try_llm_programs", lambda programs, prefill, decode: None)
    monkeypatch.setattr(llm_programs, "refuse_changed", lambda programs: None)
    monkeypatch.setattr(latency, "time_runs", lambda *args: runs)
    args = SimpleNamespace(stock="s.pte", edgefuse="e.pte", runs=2, rounds=1, warmup=0, prefill=4, decode=2,
                           threads=1, max_bytes=1 << 20)
    assert llm_commands.bench_llm_command(args, lambda _: None) == 0
    edgefuse_row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("edgefuse "))
    assert edgefuse_row.split()[-1] == f"{(1.1 * 0.9) ** 0.5:.3f}"
