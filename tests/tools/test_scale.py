"""``python -m edgefuse.tools.scale``: the real-size shapes as the public configs give them, the options it
refuses, the verdict it reads, and (slow) the whole command at a toy size. A measure: no test asserts a time
or a memory figure."""

from __future__ import annotations

import json
import os

import pytest
import torch

from edgefuse.inputs.errors import CHECK_FAILED, OK, USAGE
from edgefuse.tools import scale


def run(capsys, *argv):
    code = scale.main(["-q", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- the shapes: the public config numbers ------------------------------------------------------------


def test_qwen3_0_6b_has_the_public_configs_numbers():
    shape = scale.SHAPES["qwen3-0.6b"]
    p = shape.params
    numbers = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "vocab_size")
    assert tuple(p[k] for k in numbers) == (
        1024, 28, 16, 8, 128, 3072, 151936)
    assert p["use_qk_norm"] and p["qk_norm_before_rope"] and shape.tied and shape.model_class == "qwen3_0_6b"
    # Qwen's model card: 0.6B parameters, 0.44B of them outside the embedding
    count = scale.parameter_count(p, shape.tied)
    assert count == 596_049_920 and count - p["vocab_size"] * p["dim"] == 440_467_456
    assert scale.norm_count(p) == 28 * 4 + 1  # two a layer, two QK norms, the final one


def test_llama_3_2_1b_has_the_public_configs_numbers():
    shape = scale.SHAPES["llama-3.2-1b"]
    p = shape.params
    assert (p["dim"], p["n_layers"], p["n_heads"], p["n_kv_heads"], p["hidden_dim"], p["vocab_size"]) == (
        2048, 16, 32, 8, 8192, 128256)
    assert shape.tied and p["use_scaled_rope"] and shape.model_class == "llama3_2"
    assert scale.parameter_count(p, shape.tied) == 1_235_814_400  # Meta's 1.24B
    assert scale.norm_count(p) == 16 * 2 + 1


def _no_run(*args):
    raise AssertionError("the options were taken: the command would have run")


def test_gemma3_1b_has_the_public_configs_numbers_and_goes_through_hugging_faces_exporter():
    """export_llm has no Gemma 3, so Gemma3-1B is a transformers model (``gemma3_text``) exported with
    optimum-executorch: its config carries the public numbers, the local and global RoPE and the sliding window."""
    shape = scale.SHAPES["gemma3-1b"]
    p = shape.params
    numbers = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "vocab_size")
    assert tuple(p[k] for k in numbers) == (
        1152, 26, 4, 1, 256, 6912, 262144)
    assert shape.through_hf and "no Gemma 3 model class" in shape.unsupported
    config = scale.hf_config(shape, p)
    assert config["model_type"] == "gemma3_text" and config["tie_word_embeddings"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["intermediate_size"], config["vocab_size"]) == (
        1152, 26, 4, 1, 256, 6912, 262144)
    assert (config["query_pre_attn_scalar"], config["sliding_window"], config["rms_norm_eps"]) == (256, 512, 1e-6)
    rope = config["rope_parameters"]
    assert (rope["sliding_attention"]["rope_theta"], rope["full_attention"]["rope_theta"]) == (10000.0, 1000000.0)
    assert scale.parameter_count(p, shape.tied, shape) == GEMMA3_1B_PARAMETERS
    assert scale.norm_count(p, shape) == 26 * 6 + 1  # four a layer, two QK norms, the final one


#: Gemma3-1B's parameters as transformers builds its config (the embedding tied): Google's "1B".
GEMMA3_1B_PARAMETERS = 999_885_952


def test_gemma3s_config_keeps_its_global_layers_at_full_size_and_in_a_cut_of_two():
    """At 26 layers every sixth attends globally (layers 5, 11, 17, 23), as transformers' default pattern
    has it; a cut of two layers, under six, keeps one sliding-window layer and one global, the last."""
    shape = scale.SHAPES["gemma3-1b"]
    full = scale.hf_config(shape, shape.params)["layer_types"]
    assert len(full) == 26 and [i for i, kind in enumerate(full) if kind == "full_attention"] == [5, 11, 17, 23]
    assert set(full) == {"full_attention", "sliding_attention"}
    cut = scale.hf_config(shape, scale.sized_params(shape, 2, 64))
    assert cut["num_hidden_layers"] == 2 and cut["layer_types"] == ["sliding_attention", "full_attention"]


def test_a_cut_keeps_the_shape_and_a_toy_width_makes_heads_of_16():
    shape = scale.SHAPES["llama-3.2-1b"]
    cut = scale.sized_params(shape, 2, None)
    assert cut == {**shape.params, "n_layers": 2}
    toy = scale.sized_params(shape, 1, 64)
    assert (toy["dim"], toy["n_heads"], toy["n_kv_heads"], toy["head_dim"], toy["vocab_size"]) == (64, 4, 2, 16, 256)


# -- bad usage: exit 2 with the reason, nothing written -----------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--models", "qwen3-7b"], "unknown model 'qwen3-7b'; known: qwen3-0.6b, llama-3.2-1b, gemma3-1b"),
        (["--models", ","], "--models names nothing"),
        (["--dtypes", "fp32"], "unknown dtype 'fp32'; known: 8da4w, fp16, bf16"),
        (["--threads", "0"], "--threads must be at least 1"),
        (["--threads", "1,x"], "comma-separated thread counts"),
        (["--layers", "0"], "--layers must be at least 1"),
        (["--dim", "48"], "--dim must be a multiple of 32"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--prefill", "0"], "--prefill must be at least 1"),
        (["--repeats", "-1"], "--repeats must be at least 0"),
        (["--prefill", "1000", "--decode", "100"], "at most 1024"),
        (["--profile-rounds", "0"], "--profile-rounds must be at least 1"),
        (["--norms-removed", "--no-latency"], "--norms-removed times the program without norms against edgefuse's"),
    ],
)
def test_bad_options_exit_2_with_the_reason_and_write_nothing(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(scale, "_run", _no_run)
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, *argv, "--out", str(out_dir))
    assert code == USAGE, err
    assert message in err and "Traceback" not in err
    assert not out_dir.exists()


def test_an_option_argparse_does_not_know_exits_2(capsys):
    with pytest.raises(SystemExit) as exited:
        scale.main(["--bogus", "1"])
    assert exited.value.code == USAGE and "unrecognized arguments" in capsys.readouterr().err


# -- the verdict ----------------------------------------------------------------------------------------


def _pair(means=0, float_casts=0, integer_casts=0, matches=True, through_hf=False):
    check = {"delegates": 1, "kernels": 2, "means": 0, "casts": 0, "float_casts": 0, "error": 0.0, "allowed": 1.0,
             "matches": True}
    return scale.PairResult("m", "fp16", 3, checks={
        "stock": dict(check, means=3), "edgefuse": dict(check, means=means, casts=float_casts + integer_casts,
                                                        float_casts=float_casts, matches=matches)},
                            through_hf=through_hf)


@pytest.mark.parametrize("through_hf", [False, True])
@pytest.mark.parametrize("kwargs", [{"means": 1}, {"float_casts": 1}, {"matches": False}])
def test_a_pair_fails_when_edgefuse_leaves_a_mean_or_a_float_cast_outside_or_misses_its_bound(kwargs, through_hf):
    assert _pair(through_hf=through_hf).passed
    assert not _pair(**kwargs, through_hf=through_hf).passed


def test_integer_casts_outside_pass_through_optimum_only():
    """optimum's programs turn position ids into floats for RoPE outside XNNPACK (which takes no int64):
    casts, but no norm's. export_llm's edgefuse programs leave no cast at all outside, and are held to that."""
    assert _pair(integer_casts=2, through_hf=True).passed
    assert not _pair(integer_casts=2).passed


def test_the_norms_cost_table_reads_every_figure_of_a_row_from_its_own_pair():
    """A row is the pair of edgefuse's program and the one without norms at that thread count, ratio =
    without norms / edgefuse, with its own load; the stock pair's timing (another run) is not mixed in."""
    result = _pair()
    result.timings = [{"threads": 2, "stock": [10.0, 4.0], "edgefuse": [9.5, 3.5], "ratios": [0.95, 0.875]}]
    result.removed = {"timings": [{"threads": 2, "runs": 4, "edgefuse": [9.0, 3.0], "without_norms": [8.0, 2.4],
                                   "ratios": [0.889, 0.8], "load": [1.0, 1.5, 2.0]}]}
    header, row = scale.norm_cost_table([result]).splitlines()
    assert header.split()[:7] == ["model", "dtype", "threads", "runs", "edgefuse", "prefill", "ms"]
    assert row.split() == ["m", "fp16", "2", "4", "9.00", "8.00", "0.889", "3.000", "2.400", "0.800", "1.00", "1.50",
                           "2.00"]


def test_the_norms_cost_exports_without_norms_and_times_edgefuses_program_in_stocks_slot(tmp_path, monkeypatch):
    """norm_cost exports with edgefuse's lowering and the norms removed, in the pair's ``without-norms``
    folder, and hands the timing and the profile edgefuse's program as the pair's first (``stock``) and the
    one without norms as its second, named so: the ratio read as without norms / edgefuse is that."""
    from types import SimpleNamespace

    from edgefuse.llm import pte

    seen = {}

    def export_one(shape, dtype, params, how, model_files, folder, extra, removed=False):
        seen["export"] = (how, folder, removed)
        return {"path": os.path.join(folder, "edgefuse.pte"), "seconds": 1.0}

    def time_both(name, dtype, folder, paths, threads, args, labels=None):
        seen.setdefault("timed", []).append((dict(paths), threads, labels))
        return {"threads": threads, "stock": [10.0, 4.0], "edgefuse": [8.0, 3.0], "ratios": [0.8, 0.75]}

    def profile_both(name, dtype, folder, paths, threads, args):
        seen["profiled"] = (dict(paths), threads)
        return 3, "profile"  # the runtime took 3 threads, not the 2 asked for

    monkeypatch.setattr(scale, "export_one", export_one)
    monkeypatch.setattr(scale, "in_child", lambda step: step(lambda _: None))
    monkeypatch.setattr(pte, "read_pte",
                        lambda path: SimpleNamespace(delegate_count=1, kernel_count=2, means=0, casts=0, float_casts=0))
    monkeypatch.setattr(scale, "time_both", time_both)
    monkeypatch.setattr(scale, "profile_both", profile_both)
    edgefuse = str(tmp_path / "edgefuse.pte")
    without = str(tmp_path / "without-norms" / "edgefuse.pte")
    args = SimpleNamespace(threads=[2, 1], profile_rounds=1)
    record = scale.norm_cost(scale.SHAPES["qwen3-0.6b"], "fp16", {}, [], str(tmp_path), edgefuse, (), args,
                             lambda _: None)
    assert seen["export"] == ("edgefuse", str(tmp_path / "without-norms"), True)
    pair = {"stock": edgefuse, "edgefuse": without}
    assert seen["timed"] == [(pair, 2, ("edgefuse", scale.REMOVED)), (pair, 1, ("edgefuse", scale.REMOVED))]
    assert seen["profiled"] == (pair, 2) and record["profile_threads"] == 3  # what the runtime took
    assert record["contents"] == {"delegates": 1, "kernels": 2, "means": 0, "casts": 0, "float_casts": 0}
    # results.json names each program's medians by the program, not by the pair's slot
    timing = record["timings"][0]
    assert "stock" not in timing and (timing["edgefuse"], timing["without_norms"]) == ([10.0, 4.0], [8.0, 3.0])


def test_the_timing_and_profile_of_the_norms_cost_name_edgefuse_first_and_the_program_without_norms_second(
        monkeypatch):
    """time_both and profile_both hand llm_latency the pair in the order given (edgefuse's program in the
    ``stock`` slot) and the labels its progress and profile columns name them by; the timing's entry keeps
    the pair's slots (``stock`` the first program's medians, ratios second / first) and whether the programs
    took one token a call as the timing read it, not from the files again."""
    from types import SimpleNamespace

    from edgefuse import runtime
    from edgefuse.llm.latency import Inputs
    from edgefuse.runtime import timer
    from edgefuse.tools import llm_latency

    seen = []

    def profile_table(folder, pair, args, say, labels=None):
        seen.append((pair.stock, pair.edgefuse, labels))
        return "table"

    def time_pair(folder, pair, args, say, labels=None):
        seen.append((pair.stock, pair.edgefuse, labels))
        return [SimpleNamespace(medians=[(10.0, 4.0), (8.0, 3.0)], ratios=(0.8, 0.75),
                                inputs=Inputs(positions=False, one_token=True))]

    def no_reading(*args):
        raise AssertionError("the program's file was read again")

    monkeypatch.setattr(scale, "in_child", lambda step: step(lambda _: None))
    monkeypatch.setattr(runtime, "set_threads", lambda threads: threads + 1)  # the runtime's count, reported
    monkeypatch.setattr(runtime, "method_io", no_reading)
    monkeypatch.setattr(timer, "conditions", lambda threads: "conditions")
    monkeypatch.setattr(llm_latency, "profile_table", profile_table)
    monkeypatch.setattr(llm_latency, "time_pair", time_pair)
    paths = {"stock": "/f/fp16/edgefuse.pte", "edgefuse": "/f/fp16/without-norms/edgefuse.pte"}
    labels = ("edgefuse", scale.REMOVED)
    assert scale.profile_both("m", "fp16", "/f/fp16", paths, 1, None) == (2, "table")
    timing = scale.time_both("m", "fp16", "/f/fp16", paths, 1, None, labels=labels)
    assert seen == [("edgefuse.pte", os.path.join("without-norms", "edgefuse.pte"), labels)] * 2
    assert (timing["stock"], timing["edgefuse"], timing["ratios"]) == ([10.0, 4.0], [8.0, 3.0], [0.8, 0.75])
    assert timing["one_token"] is True


def test_a_programs_result_holds_the_floor_of_the_step_it_shows():
    """results.json's floor is the one in the shown step's bound: here the second step, the one nearest its
    bound, whose floor is not the first step's nor the largest."""
    from types import SimpleNamespace

    from edgefuse.tools.llm_check import ProgramCheck

    contents = SimpleNamespace(delegate_count=3, kernel_count=2, means=0, casts=0, float_casts=0)
    check = ProgramCheck("edgefuse", "edgefuse.pte", contents, [0.10, 0.30, 0.05], [0.40, 0.35, 0.60],
                         floor=[0.20, 0.15, 0.25])
    result = scale.program_result(check)
    assert (result["error"], result["allowed"], result["floor"], result["matches"]) == (0.30, 0.35, 0.15, True)
    assert scale.program_result(ProgramCheck("stock", "stock.pte", contents, [0.1], [0.1]))["floor"] == 0.0


def test_a_hugging_face_models_8da4w_check_measures_the_floor_on_its_eager_model(tmp_path):
    """hf_reference measures the rounding floor of an 8da4w check on the eager model (Gemma3 and Qwen3 built
    from tests/hf's configs: transformers' norms) over the check's steps, and none in float: each step's floor
    is the most any rounding of the means moves its logits, on the quantized model and the sequence of the
    check."""
    from tests.hf.hf_models import save_model
    from tests.optional import require_optimum

    from edgefuse.hf import logits
    from edgefuse.core.verify import max_error
    from edgefuse.quant.rounding import MEAN_ROUNDINGS, means_rounded

    require_optimum()
    for name in ("gemma3", "qwen3"):
        folder = save_model(str(tmp_path), name)
        assert scale.hf_reference("fp16", folder).floor is None
        reference = scale.hf_reference("8da4w", folder)
        assert len(reference.floor) == len(reference.expected) == scale.CHECK_DECODE + 1
        model = logits.eager_model(folder, torch.float32, "8da4w")
        assert all(torch.equal(a, e) for a, e in
                   zip(logits.eager_logits(model, reference.sequence, scale.CHECK_PREFILL), reference.expected))
        floor = [0.0] * len(reference.expected)
        for rounding in MEAN_ROUNDINGS:
            with means_rounded(model, rounding):
                got = logits.eager_logits(model, reference.sequence, scale.CHECK_PREFILL)
            floor = [max(f, max_error(e, g)) for f, g, e in zip(floor, got, reference.expected)]
        assert any(f > 0 for f in floor), name
        # the floor of the quantized model over the check's own sequence, each step the most of the three
        assert reference.floor == floor, (name, reference.floor, floor)


def test_a_hugging_face_models_8da4w_check_allows_edgefuse_the_floor(monkeypatch):
    """hf_results holds edgefuse's program to stock's error plus the bound plus the reference's floor, and
    reports it: 0.25 off eager where stock is 0.2 off is within a floor of 0.1, and not without it (nothing
    runs; the programs' contents are stand-ins)."""
    from types import SimpleNamespace

    from edgefuse.llm import pte

    contents = SimpleNamespace(delegate_count=1, kernel_count=0, means=0, casts=0, float_casts=0)
    monkeypatch.setattr(pte, "read_pte", lambda path: contents)

    def off(by):
        steps = [torch.linspace(-3.0, 3.0, 64), torch.linspace(-2.0, 4.0, 64)]
        for s in steps:
            s[0] += by
        return steps

    got, paths = {"stock": off(0.2), "edgefuse": off(0.25)}, {"stock": "stock.pte", "edgefuse": "edgefuse.pte"}
    results = scale.hf_results("8da4w", scale.HfReference(None, off(0.0), [0.1, 0.1]), got, paths)
    assert results["edgefuse"]["matches"] and results["edgefuse"]["floor"] == 0.1
    assert results["stock"]["matches"] and results["stock"]["floor"] == 0.0
    assert not scale.hf_results("8da4w", scale.HfReference(None, off(0.0), None), got, paths)["edgefuse"]["matches"]


# -- the whole command at a toy size ------------------------------------------------------------------


@pytest.mark.slow
def test_the_whole_command_at_a_toy_size(tmp_path, capsys):
    """Qwen3 in 8da4w at a toy size: the small Qwen3 of ``llm_check`` (QK norms) with tied embeddings, through
    export_llm's command-line engine, stock beside edgefuse, both against eager over the scale command's
    8-token prompt and 4 decode steps; no other test exports Qwen3 in 8da4w through that engine. Each export
    runs in a child process, so that the swap is taken back after an export is held by the README's
    ``export-llm --compare`` test (tests/test_readme.py) alone. The QNN rows are checked where QNN's libraries are set up; where they
    are not, the test skips after the CPU checks, saying how to set them up (the row that says so has its own test)."""
    from edgefuse.qnn.sdk import find

    code, out, err = run(capsys, "--models", "qwen3-0.6b", "--layers", "1", "--dim", "64", "--dtypes", "8da4w",
                         "--threads", "1", "--prefill", "16", "--decode", "2", "--rounds", "1", "--warmup", "0",
                         "--norms-removed", "--profile-rounds", "1", "--out", str(tmp_path))
    assert code == OK, out + err
    assert "cut for a quick run: --layers 1 --dim 64" in out
    programs = out.split("programs (")[1].split("export cost")[0]
    stock, ours = [line.split() for line in programs.splitlines() if line.startswith("qwen3-0.6b")]
    assert stock[2] == "stock" and ours[2] == "edgefuse"
    assert int(ours[3]) == 5 and int(ours[6]) == 0 and int(ours[7]) == 0 and ours[11] == "yes"  # 5 norms, none outside
    assert (int(stock[6]), int(stock[7])) == (5, 0)  # stock leaves each norm's mean outside, the QK norms' too
    assert "1 thread(s); CPU: " in out
    assert out.rstrip().endswith("all passed")
    # the same export with every norm reduced to its weight's multiply: no mean, cast or rsqrt left anywhere
    cost = out.split("what the norms still cost")[1]
    assert "qwen3-0.6b 8da4w without norms: " in cost and " 0 means, 0 casts;" in cost
    profile = cost.split("(compare the two, not the totals):")[1]
    assert "edgefuse prefill ms" in profile and "without norms prefill ms" in profile
    rsqrt = [line.split() for line in profile.splitlines() if "Reciprocal Square Root" in line]
    assert rsqrt and all(row[-7].split("/")[1] == "0" for row in rsqrt)  # calls edgefuse/without norms
    assert {"params.json", "checkpoint.pth", "8da4w"} <= set(os.listdir(tmp_path / "qwen3-0.6b"))
    if not (sdk := find()):
        pytest.skip(f"QNN tier: {sdk.reason}")
    assert "qwen3-0.6b QNN one layer fp16: edgefuse: " in out and "qwen3-0.6b QNN one layer 16a8w: edgefuse: " in out


@pytest.mark.slow
def test_gemma3_at_a_toy_size_goes_through_optimum_executorch(tmp_path, capsys):
    """Gemma3 at a toy size (two layers, a sliding-window one and a global one, width 64) through the scale
    command's Hugging Face route: a random-weight transformers model saved with save_pretrained, exported with
    optimum-executorch's xnnpack recipe and edgefuse's, both against the eager model over the 8-token prompt
    and 4 decode steps, and timed as a pair. 8da4w through optimum is tests/hf/test_export_hf.py's Gemma3."""
    from tests.optional import require_optimum

    require_optimum()
    code, out, err = run(capsys, "--models", "gemma3-1b", "--layers", "2", "--dim", "64", "--dtypes", "fp16",
                         "--threads", "1", "--prefill", "16", "--decode", "2", "--rounds", "1", "--warmup", "0",
                         "--no-qnn", "--out", str(tmp_path))
    assert code == OK, out + err
    assert "gemma3-1b: " in out and "exported with optimum-executorch" in out
    programs = out.split("programs (")[1].split("export cost")[0]
    stock, ours = [line.split() for line in programs.splitlines() if line.startswith("gemma3-1b")]
    assert stock[2] == "stock" and ours[2] == "edgefuse"
    # 13 norms (two layers of four and two QK norms, the final one); none outside edgefuse's delegates, no
    # float cast
    assert int(ours[3]) == 13 and int(ours[6]) == 0 and int(ours[7]) == 0 and ours[11] == "yes"
    assert int(stock[6]) > 0 and stock[11] == "yes"  # stock leaves norms' means outside
    latency = out.split("latency: ")[1]
    assert [line.split()[:3] for line in latency.splitlines() if line.startswith("gemma3-1b")] == [
        ["gemma3-1b", "fp16", "1"]]
    assert "gemma3-1b fp16: the programs take one token a call" in latency and "16 calls of one token" in latency
    assert out.rstrip().endswith("all passed")
    assert {"hf", "fp16"} <= set(os.listdir(tmp_path / "gemma3-1b"))
    saved_config = json.loads((tmp_path / "gemma3-1b" / "hf" / "config.json").read_text())
    assert saved_config["layer_types"] == ["sliding_attention", "full_attention"]  # the model exported has both
    # the norms scale by 1 + w with w of about 0.1 N(0, 1), not transformers' zeros: a lowering that dropped
    # or misplaced a norm's weight would miss its bound
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "gemma3-1b" / "hf" / "model.safetensors"))
    norms = torch.cat([w.flatten() for name, w in saved.items() if name.endswith("norm.weight")])
    assert norms.numel() == 2 * (4 * 64 + 2 * 16) + 64 and 0.05 < float(norms.std()) < 0.2


def test_a_model_exported_through_optimum_needs_it_installed_and_says_so_before_anything_runs(
        tmp_path, capsys, monkeypatch):
    import importlib.util

    monkeypatch.setattr(scale, "_run", _no_run)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("optimum") else real(name, *a))
    code, out, err = run(capsys, "--models", "qwen3-0.6b,gemma3-1b", "--out", str(tmp_path))
    assert code == USAGE and "Traceback" not in err
    assert "gemma3-1b is exported with optimum-executorch, which needs optimum: pip install optimum-executorch" in err
    assert os.listdir(tmp_path) == []


def test_an_out_that_is_a_file_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(scale, "_run", _no_run)
    taken = tmp_path / "taken"
    taken.write_text("a file")
    code, out, err = run(capsys, "--out", str(taken))
    assert code == USAGE and f"--out {taken}: " in err and "Traceback" not in err
    assert taken.read_text() == "a file"


def test_without_qnns_libraries_the_qnn_row_says_how_to_set_them_up(monkeypatch):
    from edgefuse.compare import qnn_flows
    from edgefuse.inputs.errors import Unavailable

    def missing():
        raise Unavailable("QNN's libraries are not set up")

    monkeypatch.setattr(qnn_flows, "require_libraries", missing)
    row = scale.qnn_layer(scale.sized_params(scale.SHAPES["qwen3-0.6b"], 1, 64))
    assert row == {"unavailable": "QNN's libraries are not set up"}
    (line,) = scale.qnn_lines("qwen3-0.6b", row)
    assert line.startswith("qwen3-0.6b QNN: not run: QNN's libraries are not set up") and "edgefuse qnn setup" in line


def test_the_hugging_face_check_releases_the_eager_model_before_a_program_loads(monkeypatch):
    """check_hf_both holds one thing of a billion parameters at a time: the eager model (with its floor
    measured) is gone when the first program is loaded."""
    import weakref
    from types import SimpleNamespace

    from edgefuse.compare import llm_programs
    from edgefuse.hf import logits
    from edgefuse.quant import rounding

    models, alive_at_load = [], []

    def eager_model(folder, dtype, qlinear):
        model = torch.nn.Linear(1, 1)
        model.config = SimpleNamespace(vocab_size=16)
        models.append(weakref.ref(model))
        return model

    def program_logits(path, sequence, prefill):
        alive_at_load.append(any(ref() is not None for ref in models))
        return [torch.zeros(1)]

    monkeypatch.setattr(scale, "in_child", lambda step: step(lambda _: None))
    monkeypatch.setattr(logits, "eager_model", eager_model)
    monkeypatch.setattr(logits, "eager_logits", lambda model, sequence, prefill: [torch.zeros(1)])
    monkeypatch.setattr(logits, "program_logits", program_logits)
    monkeypatch.setattr(rounding, "rounding_floor", lambda model, outputs, expected: [0.0])
    monkeypatch.setattr(llm_programs, "load_llm_kernels", lambda: None)
    monkeypatch.setattr(scale, "hf_results", lambda dtype, reference, got, paths: got)
    got = scale.check_hf_both("8da4w", "/m", {"stock": "s.pte", "edgefuse": "e.pte"})
    assert set(got) == {"stock", "edgefuse"} and models and alive_at_load == [False, False]


@pytest.mark.parametrize("route", ["export_llm", "optimum"])
def test_each_export_child_holds_the_allocators_thresholds_before_it_exports(monkeypatch, tmp_path, route):
    """The peak memory an export reports is measured from glibc's starting mmap and trim thresholds
    (tests/runtime/test_allocator.py shows why): the child holds them before anything of the export runs."""

    def held():
        raise RuntimeError(f"the threshold is held in process {os.getpid()}")

    monkeypatch.setattr(scale, "hold_malloc_thresholds", held)
    with pytest.raises(RuntimeError, match="the threshold is held in process") as raised:
        if route == "export_llm":
            shape = scale.SHAPES["qwen3-0.6b"]
            scale.export_one(shape, "fp16", scale.sized_params(shape, 1, 64), "stock", [], str(tmp_path), ())
        else:
            scale.export_hf_one("fp16", "stock", str(tmp_path), str(tmp_path), 32)
    assert f"held in process {os.getpid()}" not in str(raised.value)  # in the export's child, not here
