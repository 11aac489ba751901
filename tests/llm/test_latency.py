"""Timing in runs (:mod:`edgefuse.llm.latency`): each run loads the programs afresh, the one loaded first
alternating, and the runs' rounds are pooled. On stand-in programs and a stand-in clock, so what each run
loads and times is known; the commands' tests run it on real programs (tests/tools/test_llm_latency.py,
tests/cli/test_export_llm.py)."""

from __future__ import annotations

import itertools
import weakref
from types import SimpleNamespace

import pytest
import torch

from edgefuse.llm.latency import Inputs, StepFailed, load_orders, pooled, time_prefill_decode, time_runs
from edgefuse.runtime.timer import Clock


@pytest.fixture
def clock():
    """A clock that only the stand-in programs move: each step adds its program's cost in ns."""
    return SimpleNamespace(ns=0)


def _timer_clock(now) -> Clock:
    """The one timer's clock read from ``now``."""
    return Clock(wall_ns=lambda: now.ns, cpu_ns=lambda: now.ns)


class _Method:
    """A stand-in method whose every step costs ``ns`` on ``clock`` and returns logits of a vocabulary of 5;
    it fails on ``fail_at`` (a position) if given, and appends ``name`` to ``ran`` at each step if given."""

    def __init__(self, clock, ns: int, fail_at: int | None, ran: list | None, name,
                 declared: tuple[list[int], list[int]] = ([1, 128], [1])) -> None:
        self.clock, self.ns, self.fail_at, self.ran, self.name = clock, ns, fail_at, ran, name
        self.calls = 0
        self.inputs = []
        # the sizes the program declares for its tokens and its position input (export_llm's by default)
        self.metadata = SimpleNamespace(input_tensor_meta=lambda i: SimpleNamespace(sizes=lambda: declared[i]))

    def execute(self, inputs):
        self.inputs.append([t.tolist() for t in inputs])
        if inputs[1][0].item() == self.fail_at:
            raise RuntimeError("the runtime's message")
        self.calls += 1
        if self.ran is not None:
            self.ran.append(self.name)
        self.clock.ns += self.ns
        return [torch.zeros(1, inputs[0].shape[1], 5)]


class _Program:
    """A stand-in program holding one :class:`_Method`. It holds no reference cycle, so it is freed as its
    last reference goes, without the cycle collector."""

    def __init__(self, clock, ns: int, fail_at: int | None = None, ran: list | None = None, name=None) -> None:
        self.method = _Method(clock, ns, fail_at, ran, name)

    @property
    def calls(self) -> int:
        return self.method.calls


def test_export_llms_program_gets_the_start_position_and_optimums_each_tokens_position(clock):
    """export_llm's programs take the start position ``[1]``; optimum-executorch's take each token's cache
    position ``[n]`` (their position input declared longer than one)."""
    start = _Method(clock, 1, None, None, "export_llm")
    each = _Method(clock, 1, None, None, "optimum", declared=([1, 127], [127]))
    prompt, steps = torch.tensor([[5, 6, 7]]), torch.tensor([[[8]]])
    for method in (start, each):
        time_prefill_decode([method], prompt, steps, 1, 0, _timer_clock(clock))
    assert start.inputs == [[[[5, 6, 7]], [0]], [[[8]], [3]]]
    assert each.inputs == [[[[5, 6, 7]], [0, 1, 2]], [[[8]], [3]]]


def test_a_program_of_one_token_a_call_prefills_one_call_a_token(clock):
    """A program exported with static shapes (optimum's Gemma 3) declares one token: its prompt is run a
    token a call at positions 0, 1, 2, as its runner prefills, and the prefill's time is all of them."""
    single = _Method(clock, 1, None, None, "static", declared=([1, 1], [1]))
    prompt, steps = torch.tensor([[5, 6, 7]]), torch.tensor([[[8]]])
    timing = time_prefill_decode([single], prompt, steps, 1, 0, _timer_clock(clock))
    assert single.inputs == [[[[5]], [0]], [[[6]], [1]], [[[7]], [2]], [[[8]], [3]]]
    assert timing.prefill_ms == [[3 / 1e6]] and timing.decode_ms == [[1 / 1e6]]
    assert timing.inputs == Inputs(positions=False, one_token=True)  # what the scale command reports


def test_programs_that_take_their_inputs_unlike_the_first_are_refused_before_any_round(clock):
    """A pair whose prefills would not be the same work (one prompt call against a call a token) is refused,
    naming the second program, before either runs; so is a program whose inputs are not ``[1, n]`` tokens
    with a one-dimensional position input."""
    from edgefuse.llm.latency import InputsRefused

    whole = _Method(clock, 1, None, None, "dynamic")
    single = _Method(clock, 1, None, None, "static", declared=([1, 1], [1]))
    prompt, steps = torch.tensor([[5, 6, 7]]), torch.tensor([[[8]]])
    with pytest.raises(InputsRefused, match="unlike the first program") as refused:
        time_prefill_decode([whole, single], prompt, steps, 1, 0, _timer_clock(clock))
    assert refused.value.index == 1 and whole.inputs == single.inputs == []
    flat = _Method(clock, 1, None, None, "flat", declared=([4], [1]))
    with pytest.raises(InputsRefused, match=r"takes tokens of sizes \[4\]") as refused:
        time_prefill_decode([whole, flat], prompt, steps, 1, 0, _timer_clock(clock))
    assert refused.value.index == 1


def test_the_program_loaded_first_alternates_run_by_run():
    assert load_orders(2, 4) == [(0, 1), (1, 0), (0, 1), (1, 0)]
    assert load_orders(3, 2) == [(0, 1, 2), (2, 1, 0)]


def test_the_programs_strictly_alternate_through_the_timer(clock):
    ran: list[int] = []
    methods = [_Program(clock, ns=1, ran=ran, name=k).method for k in (0, 1)]
    prompt, steps = torch.zeros((1, 3), dtype=torch.long), torch.zeros((2, 1, 1), dtype=torch.long)
    time_prefill_decode(methods, prompt, steps, rounds=3, warmup=1, clock=_timer_clock(clock))
    # each program's prefill and 2 decode steps in one go, then the other's: never one program's twice in a row
    assert [(k, len(list(group))) for k, group in itertools.groupby(ran)] == [(0, 3), (1, 3)] * 4


def test_each_run_loads_afresh_in_its_order_and_times_each_program_under_its_own_index(clock):
    loads, programs = [], []

    def load(order):  # in load order, as the commands' loader returns them
        loads.append(order)
        fresh = [_Program(clock, ns=3_000_000 if k == 1 else 1_000_000) for k in order]
        programs.append(dict(zip(order, fresh)))
        return fresh

    runs = time_runs(load, 2, prefill=3, decode=2, runs=4, rounds=2, warmup=1, clock=_timer_clock(clock))
    assert loads == [(0, 1), (1, 0), (0, 1), (1, 0)]
    assert [run.order for run in runs] == loads
    # each run its own programs: a probe step of program 0 for the prompt in the first, then 1 + 2 rounds of 3 steps
    assert [[fresh[k].calls for k in (0, 1)] for fresh in programs] == [[10, 9], [9, 9], [9, 9], [9, 9]]
    for run in runs:  # program 1 costs 3 ms a step, program 0 1 ms, whichever was loaded first
        assert run.timing.medians(0) == (1.0, 1.0) and run.timing.medians(1) == (3.0, 3.0)
        assert run.timing.ratios() == (3.0, 3.0)


def test_a_run_releases_the_last_runs_programs_before_it_loads(clock):
    previous: list[weakref.ref] = []
    alive_at_load: list[int] = []

    def load(order):  # the stand-ins hold no reference cycle: one still alive here is still referenced
        alive_at_load.append(sum(ref() is not None for ref in previous))
        fresh = [_Program(clock, ns=1) for _ in order]
        previous[:] = [weakref.ref(p) for p in fresh] + [weakref.ref(p.method) for p in fresh]
        return fresh

    time_runs(load, 2, prefill=2, decode=1, runs=3, rounds=1, warmup=0, clock=_timer_clock(clock))
    assert alive_at_load == [0, 0, 0]


def test_a_failing_step_names_the_program_by_its_index_when_it_was_loaded_first(clock):
    def load(order):  # program 1 fails at its first decode step; in run 2 it is loaded first
        return [_Program(clock, ns=1, fail_at=2 if k == 1 and order[0] == 1 else None) for k in order]

    with pytest.raises(StepFailed) as failed:
        time_runs(load, 2, prefill=2, decode=1, runs=2, rounds=1, warmup=0, clock=_timer_clock(clock))
    assert failed.value.index == 1 and failed.value.position == 2


def test_pooled_holds_every_round_of_every_run_by_program(clock):
    costs = iter([1, 2, 3, 4, 5, 6])  # programs 0 and 1 cost (1, 2) ns a step in run 1, (3, 4) in 2, (5, 6) in 3

    def load(order):
        ns = {0: next(costs), 1: next(costs)}
        return [_Program(clock, ns=ns[k]) for k in order]

    runs = time_runs(load, 2, prefill=2, decode=1, runs=3, rounds=4, warmup=0, clock=_timer_clock(clock))
    whole = pooled(runs)
    assert [len(ms) for ms in whole.prefill_ms] == [12, 12] and [len(ms) for ms in whole.decode_ms] == [12, 12]
    assert whole.prefill_ms[1] == [ms for run in runs for ms in run.timing.prefill_ms[1]]
    assert sorted(set(whole.decode_ms[0])) == [1e-6, 3e-6, 5e-6]
    assert sorted(set(whole.decode_ms[1])) == [2e-6, 4e-6, 6e-6]
    assert whole.last_logits[0] is runs[-1].timing.last_logits[0]
    assert whole.inputs == runs[-1].timing.inputs == Inputs(positions=False, one_token=False)


def test_a_ratio_over_runs_is_the_geometric_mean_of_each_runs_ratio_not_the_ratio_of_pooled_medians():
    """Each program runs slower in the run it is loaded first, as at real size: the runs' ratios are 1/1.1
    and 1.2, their geometric mean 1.0445; the medians over every round would say 1.1 / 1.05 = 1.0476."""
    from edgefuse.llm.latency import PrefillDecode, TimedRun

    first = PrefillDecode([[11.0] * 3, [10.0] * 3], [[1.1] * 3, [1.0] * 3])
    second = PrefillDecode([[10.0] * 3, [12.0] * 3], [[1.0] * 3, [1.2] * 3])
    whole = pooled([TimedRun((0, 1), first), TimedRun((1, 0), second)])
    expected = (1.2 / 1.1) ** 0.5
    assert whole.ratios() == pytest.approx((expected, expected), rel=1e-12)
    assert whole.ratios(0, 1) == pytest.approx((1 / expected, 1 / expected), rel=1e-12)
    assert first.ratios() == pytest.approx((10 / 11, 1 / 1.1))  # one run: its ratio of medians
