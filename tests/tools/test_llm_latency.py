"""``python -m edgefuse.tools.llm_latency``: its argument handling, the programs ``--export-only`` prepares,
and what its tables name. A benchmark: no test here asserts a time; the timing and profile runs on
the smallest size check only what the output names."""

from __future__ import annotations

import json
import logging
import os

from types import SimpleNamespace

import pytest

from edgefuse.tools import llm_latency
from edgefuse.inputs.errors import OK, USAGE


def run(capsys, *argv):
    code = llm_latency.main(["-q", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- bad usage: exit 2 with a message, before anything is exported ------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sizes", "100x2", "--export-only", "--dir", "{tmp}"], "DIM a multiple of 32"),
        (["--sizes", "128", "--export-only", "--dir", "{tmp}"], "DIMxLAYERS"),
        (["--sizes", "128x0", "--export-only", "--dir", "{tmp}"], "at least one layer"),
        (["--dtypes", "fp64", "--export-only", "--dir", "{tmp}"], "unknown dtype 'fp64'"),
        (["--export-only"], "--export-only needs --dir"),
        (["--bench-only", "{tmp}", "--dir", "{tmp}"], "drop --dir"),
        (["--bench-only", "{tmp}"], "no manifest.json"),
        (["--profile", "128x2:int8", "--bench-only", "{tmp}"], "DTYPE one of"),
        (["--profile", "128x2:fp32", "--export-only", "--dir", "{tmp}"], "not with --export-only"),
        (["--threads", "0", "--bench-only", "{tmp}"], "--threads must be at least 1"),
        (["--rounds", "0", "--bench-only", "{tmp}"], "--rounds must be at least 1"),
    ],
)
def test_bad_arguments_exit_2_with_a_message_and_write_nothing(tmp_path, capsys, argv, message):
    code, out, err = run(capsys, *(a.format(tmp=tmp_path) for a in argv))
    assert code == USAGE, err
    assert message in err and "Traceback" not in err
    assert os.listdir(tmp_path) == []


def test_export_only_and_bench_only_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        llm_latency.main(["--export-only", "--bench-only", str(tmp_path)])
    assert exited.value.code == USAGE and "not allowed with" in capsys.readouterr().err


def _manifest(folder, pairs, seq=128, context=256):
    for pair in pairs:
        for name in (pair["stock"], pair["edgefuse"]):
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
    (folder / "manifest.json").write_text(json.dumps({"max_seq_length": seq, "max_context_length": context,
                                                      "pairs": pairs}))


def test_bench_only_refuses_a_prefill_and_decode_the_programs_cannot_take(tmp_path, capsys):
    _manifest(tmp_path, [{"size": "128x2", "dtype": "fp32", "stock": "a/stock.pte", "edgefuse": "a/edgefuse.pte"}])
    code, _, err = run(capsys, "--bench-only", str(tmp_path), "--prefill", "100", "--decode", "200")
    assert code == USAGE and "does not fit" in err


@pytest.mark.parametrize("name", ["../outside.pte", "/etc/passwd", "missing.pte"])
def test_bench_only_refuses_a_manifest_naming_a_program_outside_its_folder(tmp_path, capsys, name):
    folder = tmp_path / "programs"
    _manifest(folder, [{"size": "128x2", "dtype": "fp32", "stock": "a/stock.pte", "edgefuse": "a/edgefuse.pte"}])
    data = json.loads((folder / "manifest.json").read_text())
    data["pairs"][0]["edgefuse"] = name
    (folder / "manifest.json").write_text(json.dumps(data))
    (tmp_path / "outside.pte").write_bytes(b"")
    code, _, err = run(capsys, "--bench-only", str(folder))
    assert code == USAGE and "is not a file inside" in err


def test_bench_only_says_when_no_prepared_pair_is_asked_for(tmp_path, capsys):
    _manifest(tmp_path, [{"size": "128x2", "dtype": "fp32", "stock": "a/stock.pte", "edgefuse": "a/edgefuse.pte"}])
    code, _, err = run(capsys, "--bench-only", str(tmp_path), "--dtypes", "bf16")
    assert code == USAGE and "no program of the sizes" in err


def test_a_malformed_manifest_exits_2(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text('{"pairs": 3}')
    code, _, err = run(capsys, "--bench-only", str(tmp_path))
    assert code == USAGE and "not a manifest of this command" in err


def test_the_export_context_fits_the_prefill_and_the_decode_steps():
    assert llm_latency.context_for(100, 32) == (128, 256)
    assert llm_latency.context_for(10, 12) == (128, 128)
    seq, context = llm_latency.context_for(200, 100)
    assert seq > 200 and context >= 301 and context % 128 == 0


# -- the verdict ----------------------------------------------------------------------------------------


def _row(size, dtype, prefill, decode, run_="all", first=""):
    pair = llm_latency.Pair(size, dtype, "s.pte", "e.pte", logits="float32")
    return llm_latency.Row(pair, run_, first, [(10.0, 1.0), (10.0 * prefill, decode)], (prefill, decode))


def test_the_verdict_holds_at_two_decimals_and_names_the_largest_ratio():
    rows = [_row("128x2", "fp32", 0.97, 0.999), _row("1024x4", "fp16", 0.90, 0.95)]
    assert llm_latency.verdict(rows).startswith("edgefuse never slower")
    assert "largest ratio 0.999: 128x2 fp32 decode" in llm_latency.verdict(rows)
    rows.append(_row("128x2", "bf16", 1.02, 0.98))
    line = llm_latency.verdict(rows)
    assert line.startswith("edgefuse slower than stock at the median (ratio above 1.00) in: 128x2 bf16 prefill")
    assert "largest ratio 1.020: 128x2 bf16 prefill (all runs)" in line


def test_the_verdict_reads_each_pairs_runs_pooled_not_a_single_run():
    """One run of two is 1.02 (the program loaded first runs slower); the line of all runs decides."""
    rows = [_row("128x2", "8da4w", 0.99, 1.02, 1, "edgefuse"), _row("128x2", "8da4w", 0.99, 0.97, 2, "stock"),
            _row("128x2", "8da4w", 0.99, 0.995)]
    assert llm_latency.verdict(rows).startswith("edgefuse never slower")
    assert "largest ratio 0.995: 128x2 8da4w decode (all runs)" in llm_latency.verdict(rows)


def test_the_latency_table_has_one_row_per_run_and_one_for_all_runs():
    table = llm_latency.latency_table([_row("128x2", "fp32", 0.995, 0.9, 1, "stock"),
                                       _row("128x2", "fp32", 0.985, 0.91, 2, "edgefuse"),
                                       _row("128x2", "fp32", 0.99, 0.905)])
    lines = table.splitlines()
    assert lines[0].split()[:6] == ["size", "dtype", "run", "loaded", "first", "logits"] and len(lines) == 4
    assert lines[1].split()[2:4] == ["1", "stock"] and lines[2].split()[2:4] == ["2", "edgefuse"]
    assert lines[3].split()[2:4] == ["all", "-"]
    assert lines[1].split()[7] == "0.995" and lines[2].split()[-1] == "0.910"


def _timed(order, stock_ms, edgefuse_ms):
    """A run of stand-ins that take their inputs as optimum's Gemma 3 does, which the rows carry on."""
    from edgefuse.llm.latency import Inputs, PrefillDecode, TimedRun

    return TimedRun(order, PrefillDecode([[10.0], [10.0 * edgefuse_ms / stock_ms]], [[stock_ms], [edgefuse_ms]],
                                         [None, None], inputs=Inputs(positions=False, one_token=True)))


@pytest.mark.parametrize("ratio, repeats, runs", [(1.01, 1, 4), (1.01, 2, 6), (0.95, 1, 2), (1.01, 0, 2)])
def test_a_pair_is_timed_in_two_runs_and_again_in_pairs_of_runs_when_close(monkeypatch, ratio, repeats, runs):
    """Two runs, each program loaded first once; a pair whose pooled ratio is 0.99 or above gets two more
    runs per ``--repeats``, numbered on, and the ``all`` line pools every run."""
    from edgefuse.llm.latency import load_orders

    calls = []

    def bench_pair(programs, pair, args, count, first_run, say, labels=None):
        calls.append((count, first_run))
        return [_timed(order, 1.0, ratio) for order in load_orders(2, count)]

    monkeypatch.setattr(llm_latency, "pair_programs", lambda folder, pair, args, say: [])
    monkeypatch.setattr(llm_latency, "bench_pair", bench_pair)
    pair = llm_latency.Pair("128x2", "8da4w", "s.pte", "e.pte", logits="float32")
    rows = llm_latency.time_pair("folder", pair, SimpleNamespace(repeats=repeats), lambda _: None)
    assert calls == [(2, 1)] + ([(2 * repeats, 3)] if runs > 2 else [])
    assert [(r.run, r.first) for r in rows[:-1]] == [(k, ("stock", "edgefuse")[(k - 1) % 2]) for k in range(1, runs + 1)]
    assert (rows[-1].run, rows[-1].first) == ("all", "")
    assert rows[-1].ratios[1] == pytest.approx(ratio)
    assert all(row.inputs.one_token and not row.inputs.positions for row in rows)  # each run's and the pooled row's


def test_the_all_line_and_the_repeat_rule_read_the_runs_geometric_mean_not_the_pooled_medians(monkeypatch):
    """Runs whose decode ratios are 1.1 and 0.9 at different scales: their geometric mean, 0.995, calls for
    more runs and is the ``all`` line's ratio; the medians over every round would say 1.9 / 2.0 = 0.95."""
    from edgefuse.llm.latency import PrefillDecode, TimedRun, load_orders

    calls = []

    def bench_pair(programs, pair, args, count, first_run, say, labels=None):
        calls.append((count, first_run))
        timings = [([1.0], [1.1]), ([3.0], [2.7])]
        return [TimedRun(order, PrefillDecode([[10.0], [9.0]], list(timings[k % 2])))
                for k, order in enumerate(load_orders(2, count))]

    monkeypatch.setattr(llm_latency, "pair_programs", lambda folder, pair, args, say: [])
    monkeypatch.setattr(llm_latency, "bench_pair", bench_pair)
    pair = llm_latency.Pair("128x2", "8da4w", "s.pte", "e.pte", logits="float32")
    rows = llm_latency.time_pair("folder", pair, SimpleNamespace(repeats=1), lambda _: None)
    assert calls == [(2, 1), (2, 3)]
    assert rows[-1].ratios[1] == pytest.approx((1.1 * 0.9) ** 0.5)


def test_the_progress_of_a_timing_names_the_program_loaded_first_by_the_labels_given(monkeypatch):
    """Each run's progress line names the program loaded first: stock or edgefuse by default, or as the
    caller names the pair (the scale command's edgefuse and the program without norms)."""
    from edgefuse.compare import llm_programs
    from edgefuse.llm import latency
    from edgefuse.llm.latency import load_orders

    def time_runs(load, count, prefill, decode, runs, rounds, warmup):
        for order in load_orders(count, runs):
            load(order)
        return []

    monkeypatch.setattr(llm_programs, "load_llm_programs", lambda programs, note: programs)
    monkeypatch.setattr(llm_programs, "refuse_changed", lambda programs: None)
    monkeypatch.setattr(latency, "time_runs", time_runs)
    pair = llm_latency.Pair("128x2", "fp16", "a.pte", "b.pte")
    args = SimpleNamespace(prefill=4, decode=2, rounds=1, warmup=0)
    for labels, names in ((None, ("stock", "edgefuse")), (("edgefuse", "without norms"), ("edgefuse", "without norms"))):
        said = []
        given = () if labels is None else (labels,)  # None: the default, stock and edgefuse
        llm_latency.bench_pair([("a.pte", b""), ("b.pte", b"")], pair, args, 2, 1, said.append, *given)
        assert [line.split("(")[1].split(" loaded first")[0] for line in said] == [names[0], names[1]]


def test_the_profile_table_is_headed_by_the_labels_given_and_its_differences_are_second_minus_first(monkeypatch):
    """The profile's columns and its largest-differences lines name the pair's two programs by the labels
    given (the pair's ``stock`` program first), and a difference is the second's time minus the first's."""
    from edgefuse.compare import llm_programs
    from edgefuse.llm import latency, profile
    from edgefuse.llm.profile import INSIDE, Profile, ProfileRow

    def profiled(blob, prompt, steps, rounds):
        ms = {b"first": 2.0, b"second": 0.5}[blob]
        return Profile({(INSIDE, "Square"): ProfileRow(INSIDE, "Square", 3, 1.0, ms, ms / 2)}, rounds)

    held = [("f", SimpleNamespace(read=lambda: b"first")), ("s", SimpleNamespace(read=lambda: b"second"))]
    monkeypatch.setattr(llm_latency, "pair_programs", lambda folder, pair, args, say: held)
    monkeypatch.setattr(llm_programs, "load_llm_programs", lambda programs, note: [SimpleNamespace(method=None)])
    monkeypatch.setattr(latency, "prompt_for", lambda method, prefill, decode: (None, None))
    monkeypatch.setattr(profile, "profile_prefill_decode", profiled)
    pair = llm_latency.Pair("128x2", "fp16", "f", "s")
    args = SimpleNamespace(prefill=4, decode=2, profile_rounds=1)
    table = llm_latency.profile_table("folder", pair, args, lambda _: None, ("edgefuse", "without norms"))
    header, row = table.splitlines()[0], table.splitlines()[1].split()
    for column in ("calls edgefuse/without norms", "edgefuse prefill ms", "without norms prefill ms",
                   "edgefuse decode ms/token", "without norms decode ms/token"):
        assert column in header
    assert "stock" not in table
    assert row[-4:] == ["-1.5000", "1.0000", "0.2500", "-0.7500"]
    assert "largest differences in the prefill (without norms - edgefuse, ms): Square -1.5000" in table


# -- the smallest size, exported ------------------------------------------------------------------------
# ``--export-only`` of the smallest Llama (64x1) in float32 is the session's ``llama_fp32_programs``
# (tests/conftest.py): tests/cli/test_export_llm.py reads and times its programs too.


@pytest.mark.slow
def test_export_only_writes_the_model_files_both_programs_and_the_manifest(llama_fp32_programs):
    folder, code, out = llama_fp32_programs
    assert code == OK, out
    for name in ("manifest.json", "64x1/params.json", "64x1/checkpoint.pth", "64x1/fp32/stock.pte",
                 "64x1/fp32/edgefuse.pte"):
        assert (folder / name).is_file(), name
    manifest = json.loads((folder / "manifest.json").read_text())
    (pair,) = manifest["pairs"]
    assert (pair["size"], pair["dtype"], pair["logits"], pair["agree"]) == ("64x1", "fp32", "float32", True)
    assert pair["contents"]["stock"]["means"] == 3 and pair["contents"]["edgefuse"]["means"] == 0
    assert (manifest["max_seq_length"], manifest["max_context_length"]) == (128, 128)
    assert "--bench-only" in out.splitlines()[-1]
    assert not (folder / "outputs").exists() and not os.path.exists("outputs")  # hydra's run folder stays inside


@pytest.mark.slow
def test_bench_only_prints_a_row_per_run_and_per_pair_and_the_conditions(llama_fp32_programs, capsys):
    folder, _, _ = llama_fp32_programs
    code, out, err = run(capsys, "--bench-only", str(folder), "--prefill", "8", "--decode", "4", "--rounds", "1",
                         "--warmup", "0", "--repeats", "0")
    assert code == OK, err
    lines = out.splitlines()
    assert "1 thread(s)" in lines[0] and "CPU: " in lines[0] and "prefill of 8 tokens" in lines[0]
    assert "stock loaded first in one and edgefuse in the other" in lines[0]
    assert lines[1].split()[:3] == ["size", "dtype", "run"]
    assert [line.split()[:5] for line in lines[2:5]] == [["64x1", "fp32", "1", "stock", "float32"],
                                                         ["64x1", "fp32", "2", "edgefuse", "float32"],
                                                         ["64x1", "fp32", "all", "-", "float32"]]
    assert lines[5].startswith("edgefuse ") and "(all runs)" in lines[5]


@pytest.mark.slow
def test_the_profile_names_the_kernels_outside_and_xnnpacks_operators(llama_fp32_programs, capsys):
    folder, _, _ = llama_fp32_programs
    code, out, err = run(capsys, "--bench-only", str(folder), "--profile", "64x1:fp32", "--prefill", "8",
                         "--decode", "2", "--profile-rounds", "1")
    assert code == OK, err
    lines = out.splitlines()
    assert lines[1].split()[:3] == ["group", "what", "calls"]
    assert lines[-2].startswith("largest differences in the prefill (edgefuse - stock, ms): ")
    assert lines[-1].startswith("largest differences in the decode (edgefuse - stock, ms): ")
    rows = {(line.split()[0], " ".join(line.split()[1:-7])): line.split()[-7] for line in lines[2:-2]}
    assert rows[("outside", "aten::mean.out")] == "3/0"  # stock's three means, none left by edgefuse
    assert rows[("inside", "XnnpackBackend: Fully Connected (NC, F32) GEMM")].split("/")[0] != "0"
    assert ("delegate", "XnnpackBackend calls") in rows and ("method", "Method::execute (whole call)") in rows


def test_a_config_export_llm_rejects_is_a_usage_error(monkeypatch):
    from edgefuse.tools import llm_check
    from edgefuse.inputs.errors import UsageError
    from edgefuse.llm.export import ConfigRejected

    def rejected(*args, **kwargs):
        raise ConfigRejected("Could not override 'export.nothing'")

    monkeypatch.setattr(llm_check, "export_programs", rejected)
    with pytest.raises(UsageError, match="export_llm rejected llama-64x1-fp32:\nCould not override"):
        llm_latency._exported(llm_latency.dtype_case("64x1", "fp32"), ("p", "c"), "unused", ())


def test_llm_check_exits_2_with_export_llms_message_when_it_rejects_a_case(monkeypatch, capsys):
    from edgefuse.tools import llm_check
    from edgefuse.llm.export import ConfigRejected

    def rejected(*args, **kwargs):
        print("Using int4 weight and int8 dynamic activation quantization!")  # as export_llm prints
        logging.getLogger().warning("Model after source transforms: Transformer(...)")  # and logs
        raise ConfigRejected("TorchRuntimeError: RuntimeError when making fake tensor call")

    monkeypatch.setattr(llm_check, "check_case", rejected)
    assert llm_check.main(["--cases", "llama-8da4w", "--dim", "128", "--layers", "2"]) == 2
    out, err = capsys.readouterr()
    assert "export_llm rejected llama-8da4w (128 wide, 2 layer(s)):\nTorchRuntimeError" in err
    assert "Traceback" not in err
    assert out == ""  # what export_llm prints goes to stderr: stdout holds the table alone
    assert "Model after source transforms" not in err  # its log records below ERROR are dropped


def test_the_manifest_is_never_written_through_a_link(tmp_path):
    """A link at the manifest's name, or at the name a fixed temporary file would have, is not written
    through: the manifest is a new file renamed into place."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's file\n")
    folder = tmp_path / "programs"
    folder.mkdir()
    (folder / "manifest.json.tmp").symlink_to(victim)
    (folder / "manifest.json").symlink_to(victim)
    llm_latency.write_manifest(str(folder), {"max_seq_length": 128, "max_context_length": 128}, [])
    assert victim.read_text() == "the victim's file\n"
    assert json.loads((folder / "manifest.json").read_text())["pairs"] == []
    assert not (folder / "manifest.json").is_symlink()


def test_a_manifest_past_its_bound_exits_2_before_it_is_parsed(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text(" " * llm_latency.MANIFEST_BYTES + "{}")
    code, _, err = run(capsys, "--bench-only", str(tmp_path))
    assert code == USAGE and f"past the bound of {llm_latency.MANIFEST_BYTES:,}" in err and "Traceback" not in err
