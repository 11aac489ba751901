"""The tools time through the one timer (:func:`edgefuse.runtime.timer.alternate`), their programs
alternating: on stand-in programs and passes, so that no model is lowered or rewritten."""

from __future__ import annotations

from types import SimpleNamespace

import torch

import edgefuse.runtime.timer as timer
from edgefuse.tools import pass_time, xnnpack_bench


def _recording(alternate, handed: list):
    """``alternate`` that first notes the programs of the tasks it is handed."""

    def recorded(tasks, *args, **kwargs):
        handed.append([task.program for task in tasks])
        return alternate(tasks, *args, **kwargs)

    return recorded


def test_xnnpack_bench_times_both_programs_through_the_timer(monkeypatch):
    handed, ran = [], []

    def loaded(k):  # a stand-in loaded program: a full call and the program alone, each noted
        return SimpleNamespace(execute=lambda flat: ran.append(k), run_again=lambda: ran.append(k))

    monkeypatch.setattr(timer, "alternate", _recording(timer.alternate, handed))
    programs = [SimpleNamespace(loaded=loaded(k)) for k in (0, 1)]
    medians, runs = xnnpack_bench._time(programs, torch.zeros(1), runs=5, budget=60.0)
    assert len(medians) == 2 and runs == 5
    assert handed == [[0, 0, 1, 1]] * 2  # the probe round, then the timed rounds: each program's two calls
    assert all(a != b for a, b in zip(ran, ran[1:]))  # no program twice in a row


def test_pass_time_times_both_sides_through_the_timer(monkeypatch):
    handed, ran = [], []
    monkeypatch.setattr(timer, "alternate", _recording(timer.alternate, handed))
    monkeypatch.setattr(pass_time, "_stock", lambda gm: ran.append("stock") or (1, None))
    monkeypatch.setattr(pass_time, "_edgefuse", lambda gm: ran.append("edgefuse") or (1, 1))
    times = pass_time.measure(SimpleNamespace(module=lambda: None), runs=3)
    assert set(times) == {"stock", "edgefuse"}
    assert handed == [["stock", "edgefuse"]]
    assert ran == ["stock", "edgefuse"] * 4  # a warm-up round and 3 timed ones, alternating


def test_pass_time_states_the_thread_count_and_cpu_it_timed_on(monkeypatch, capsys):
    graph = SimpleNamespace(module=lambda: SimpleNamespace(graph=SimpleNamespace(nodes=[])))
    monkeypatch.setattr(pass_time, "capture_graph", lambda layers, tokens: graph)
    monkeypatch.setattr(pass_time, "measure", lambda program, runs: {
        "stock": pass_time.PassTime(1.0, 1.0, 1), "edgefuse": pass_time.PassTime(1.0, 1.0, 1, 1)})
    assert pass_time.main(["--layers", "1", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert f"\n{torch.get_num_threads()} thread(s); CPU: " in out
    assert "MKL" not in out  # eager graph passes: no runtime pool beside MKL
