"""The one timer's rules (:mod:`edgefuse.runtime.timer`) on stand-in tasks and a stand-in clock that only
the tasks move, so every sample is known; and the CPU features a timing states, read from real
``/proc/cpuinfo`` texts."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from edgefuse.runtime.timer import WHOLE, Clock, Task, alternate, conditions, cpu_features, round_orders

DATA = Path(__file__).parent / "data"


class FakeClock:
    """Nanoseconds that pass only when a task says so; CPU time passes at ``cpu_share`` of the wall clock."""

    def __init__(self, cpu_share: float = 1.0) -> None:
        self.wall, self.cpu_share = 0, cpu_share

    def spend(self, ns: int) -> None:
        self.wall += ns

    def timer_clock(self) -> Clock:
        return Clock(wall_ns=lambda: self.wall, cpu_ns=lambda: int(self.wall * self.cpu_share))


def _costing(clock: FakeClock, program: str, costs, calls: list[str]) -> Task:
    """A task of ``program`` whose calls cost ``costs`` ns one after the other, noting each call in ``calls``."""
    costs = iter(costs)

    def run(mark) -> None:
        calls.append(program)
        clock.spend(next(costs))

    return Task(program, run)


def test_two_programs_alternate_strictly_across_the_rounds_warm_up_included():
    clock, calls = FakeClock(), []
    tasks = [_costing(clock, p, [1] * 5, calls) for p in ("stock", "edgefuse")]
    alternate(tasks, rounds=3, warmup=2, clock=clock.timer_clock())
    assert calls == ["stock", "edgefuse"] * 5


def test_more_tasks_are_shuffled_each_round_with_no_program_twice_in_a_row():
    programs = ["stock", "stock", "edgefuse", "edgefuse", "floor", "floor"]  # a full call and the program alone each
    orders = round_orders(programs, rounds=50)
    assert all(sorted(order) == list(range(6)) for order in orders)  # every task once a round
    ran = [programs[k] for order in orders for k in order]
    assert all(a != b for a, b in zip(ran, ran[1:]))  # also where one round ends and the next begins
    assert len({tuple(order) for order in orders}) > 1  # shuffled, not one fixed order
    assert round_orders(programs, rounds=50) == orders  # seeded: the same run orders the same way
    assert round_orders(programs, rounds=50, seed=1) != orders


def test_an_order_that_must_repeat_a_program_is_refused():
    with pytest.raises(ValueError, match="would run twice in a row"):
        round_orders(["stock", "stock", "edgefuse"], rounds=1)
    with pytest.raises(ValueError, match="would run twice in a row"):
        round_orders(["stock", "stock"], rounds=3)  # two tasks of one program: no alternation either


def test_a_single_task_runs_alone_every_round():
    assert round_orders(["stock"], rounds=3) == [[0], [0], [0]]  # as llm/profile.py times one program


def test_the_warm_up_rounds_are_run_and_not_kept():
    clock, calls = FakeClock(), []
    # the first three calls of each program are slow (a cold cache), the kept ones cost 2000 ns
    tasks = [_costing(clock, p, [90_000] * 3 + [2_000] * 4, calls) for p in ("stock", "edgefuse")]
    samples = alternate(tasks, rounds=4, warmup=3, clock=clock.timer_clock())
    assert len(calls) == 14
    assert [s.wall_us[WHOLE] for s in samples] == [[2.0] * 4, [2.0] * 4]


def test_a_table_reads_the_median_of_the_kept_rounds_on_either_clock():
    clock, calls = FakeClock(cpu_share=0.5), []
    tasks = [_costing(clock, "stock", [5_000, 1_000, 9_000, 3_000], calls),
             _costing(clock, "edgefuse", [7_000, 7_000, 1_000, 7_000], calls)]
    stock, edgefuse = alternate(tasks, rounds=4, warmup=0, clock=clock.timer_clock())
    assert stock.median() == 4.0  # of 1, 3, 5 and 9 us: the middle two's mean
    assert stock.median(cpu=True) == 2.0
    assert edgefuse.median() == 7.0  # not the mean (5.5): one fast round moves a median not at all


def test_marked_parts_are_timed_from_the_previous_mark():
    clock = FakeClock()

    def prefill_then_decode(mark) -> None:
        clock.spend(3_000)
        mark("prefill")
        clock.spend(500)
        mark("decode")

    (samples,) = alternate([Task("p", prefill_then_decode)], rounds=2, warmup=1, clock=clock.timer_clock())
    assert samples.wall_us == {"prefill": [3.0, 3.0], "decode": [0.5, 0.5]}
    assert samples.cpu_us == {"prefill": [3.0, 3.0], "decode": [0.5, 0.5]}


def test_garbage_collection_is_off_while_timing_and_back_on_after():
    seen = []
    alternate([Task("p", lambda mark: seen.append(gc.isenabled()))], rounds=2, warmup=1)
    assert seen == [False, False, False] and gc.isenabled()


# --- the CPU features a timing states, from real /proc/cpuinfo texts -------------------------------------
# amd-epyc-zen4: this project's measuring machine (its first processor's block as the kernel wrote it);
# xeon-sapphire-rapids: the flags line a Xeon Platinum 8480+ printed, with the lines naming the CPU;
# graviton3-neoverse-v1: an AWS Graviton3's Features line as the kernel prints it, with its part numbers.

def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_an_x86_cpu_with_float16_arithmetic_is_said_to_have_it():
    text = cpu_features(_read("xeon-sapphire-rapids.cpuinfo"))
    assert text == (
        "Intel(R) Xeon(R) Platinum 8480+; has F16C (float16 conversions), AVX512-FP16 (float16 arithmetic), "
        "AVX512-BF16 (bfloat16 dot products), AMX-BF16, AVX512-VNNI (int8 dot products), "
        "AVX-VNNI (int8 dot products); lacks AMX-FP16"
    )


def test_an_x86_cpu_without_float16_arithmetic_is_said_to_lack_it():
    text = cpu_features(_read("amd-epyc-zen4.cpuinfo"))
    assert text == (
        "AMD EPYC; has F16C (float16 conversions), AVX512-BF16 (bfloat16 dot products), "
        "AVX512-VNNI (int8 dot products); lacks AVX512-FP16 (float16 arithmetic), AMX-FP16, AMX-BF16, "
        "AVX-VNNI (int8 dot products)"
    )


def test_an_arm_cpu_is_named_by_its_parts_and_its_features_read_from_their_arm_spelling():
    text = cpu_features(_read("graviton3-neoverse-v1.cpuinfo"))
    assert text == (
        "Arm CPU implementer 0x41 part 0xd40; has Arm FP16 scalar arithmetic, Arm FP16 vector arithmetic, "
        "Arm BF16, Arm int8 dot products, Arm int8 matrix multiply; lacks none"
    )
    older = _read("graviton3-neoverse-v1.cpuinfo").replace(" i8mm bf16", "")  # a Neoverse N1's set lacks these
    assert cpu_features(older).endswith("lacks Arm BF16, Arm int8 matrix multiply")


def test_a_timing_states_its_threads_and_the_cpu():
    assert conditions(2, _read("amd-epyc-zen4.cpuinfo")).startswith("2 thread(s); CPU: AMD EPYC; has F16C")


def test_a_timing_states_what_mkl_was_told():
    from edgefuse.runtime.blas import blas_threads

    assert conditions(2, _read("amd-epyc-zen4.cpuinfo")).endswith("; " + blas_threads())
