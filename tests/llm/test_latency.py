"""Timing in runs (:mod:`edgefuse.llm.latency`): each run loads the programs afresh, the one loaded first
alternating, and the runs' rounds are pooled. On stand-in programs, so what each run loads and times is
known; the commands' tests run it on real programs (tests/cli/test_llm_latency.py, test_export_llm.py)."""

from __future__ import annotations

import time

import torch

from edgefuse.llm.latency import load_orders, pooled, time_runs


class _Method:
    """Logits of a vocabulary of 5 after ``pause`` seconds, counting its calls."""

    def __init__(self, pause: float) -> None:
        self.pause, self.calls = pause, 0

    def execute(self, inputs):
        self.calls += 1
        time.sleep(self.pause)
        return [torch.zeros(1, inputs[0].shape[1], 5)]


class _Program:
    def __init__(self, pause: float) -> None:
        self.method = _Method(pause)


def test_the_program_loaded_first_alternates_run_by_run():
    assert load_orders(2, 4) == [(0, 1), (1, 0), (0, 1), (1, 0)]
    assert load_orders(3, 2) == [(0, 1, 2), (2, 1, 0)]


def test_each_run_loads_afresh_in_its_order_and_times_each_program_under_its_own_index():
    loads, programs = [], []

    def load(order):
        loads.append(order)
        fresh = {k: _Program(pause=0.002 if k == 1 else 0.0) for k in order}
        programs.append(fresh)
        return [fresh[k] for k in range(2)]

    runs = time_runs(load, 2, prefill=3, decode=2, runs=4, rounds=2, warmup=1)
    assert loads == [(0, 1), (1, 0), (0, 1), (1, 0)]
    assert [run.order for run in runs] == loads
    # every run its own programs: a probe step for the prompt in the first, then (1 + 2) rounds of 3 steps
    assert [[p.method.calls for p in fresh.values()] for fresh in programs] == [[10, 9], [9, 9], [9, 9], [9, 9]]
    for run in runs:  # program 1 sleeps 2 ms a step whichever was loaded first
        (slow_prefill, slow_decode), (fast_prefill, fast_decode) = run.timing.medians(1), run.timing.medians(0)
        assert slow_prefill >= 2.0 > fast_prefill and slow_decode >= 2.0 > fast_decode
        assert len(run.timing.prefill_ms[0]) == 2 and len(run.timing.decode_ms[1]) == 2


def test_pooled_holds_every_round_of_every_run_by_program():
    runs = time_runs(lambda order: [_Program(0.0), _Program(0.0)], 2, prefill=2, decode=1, runs=3, rounds=4,
                     warmup=0)
    whole = pooled(runs)
    assert [len(ms) for ms in whole.prefill_ms] == [12, 12] and [len(ms) for ms in whole.decode_ms] == [12, 12]
    assert whole.prefill_ms[1] == [ms for run in runs for ms in run.timing.prefill_ms[1]]
    assert whole.last_logits[0] is runs[-1].timing.last_logits[0]
