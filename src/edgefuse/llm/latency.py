"""Prefill latency and decode time per token of LLM programs with a KV cache, timed side by side.

An ``export_llm`` program takes tokens ``[1, n]`` and the start position ``[1]``; one optimum-executorch
wrote takes the tokens and their cache positions ``[n]``, and where it was exported with static shapes
(Gemma 3) one token a call, so that its prefill is one call a prompt token (:func:`inputs_of`,
:func:`run_prompt`). :func:`time_prefill_decode`
runs each program through the same prompt at position 0 and then single-token decode steps with the one
timer (:mod:`edgefuse.runtime.timer`: the programs alternating, so a change of machine load hits all
alike) and keeps every round's times; the medians are what a table shows.

Which program is loaded first into a process moves its time (likely through where its memory lands).
At real size it moves it far more than the differences a comparison looks for: on the 2-core x86 machine
the project is measured on, one ``.pte`` (Llama-3.2-1B in 8da4w, a 1.75 GB file) timed against a copy of itself at
1 thread, six runs of 15 rounds (prefill 128 tokens, 16 decode steps, MKL pinned), gave decode ratios
(copy over original) of 0.967, 0.916 and 0.936 with the original loaded first and 1.080, 1.065 and 1.052
with the copy loaded first: the program loaded first ran 3 to 9 % slower (in that session; in another,
the same Llama pair's 20 runs put the effect near 1 %, and how large it is varies). The medians over every round
of every run then sit between two clusters and read 1.016 for two identical programs. :func:`time_runs`
therefore loads the programs afresh for each run, alternating which is loaded first (:func:`load_orders`),
and a ratio is each run's ratio of medians, combined over the runs by their geometric mean
(:meth:`PrefillDecode.ratios` of :func:`pooled`): for two programs the loaded-first factor then cancels
in each pair of runs, and the six runs above read 1.001. (With more programs :func:`load_orders` never
loads a middle one first; every caller times two.)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from edgefuse.runtime.timer import Clock, Task, alternate


def llm_inputs(tokens: torch.Tensor, position: int, positions: bool = False) -> list[torch.Tensor]:
    """The inputs of a program with a KV cache: tokens ``[1, n]`` and the start position ``[1]`` (export_llm's),
    or with ``positions`` each token's cache position ``[n]`` (optimum-executorch's)."""
    if positions:
        return [tokens, torch.arange(position, position + tokens.shape[1], dtype=torch.long)]
    return [tokens, torch.tensor([position], dtype=torch.long)]


class InputsRefused(ValueError):
    """A program's inputs are not those of an LLM with a KV cache as a timing feeds them, or are fed unlike
    the first program's (their prefills would not be the same work); ``index`` is the program's place."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index


@dataclass(frozen=True)
class Inputs:
    """How a program takes its inputs: each token's cache position (optimum-executorch's) rather than the
    start position (export_llm's), and one token a call (exported with static shapes, as optimum exports
    Gemma 3), whose prompt is then run a token a call (:func:`run_prompt`)."""

    positions: bool
    one_token: bool


def inputs_of(method, index: int = 0) -> Inputs:
    """How a loaded method (``LoadedProgram.method``) takes its inputs, read from the sizes it declares (a
    dynamic length's bound): tokens ``[1, n]``, then its start position ``[1]`` or cache positions ``[n]``.
    :class:`InputsRefused` for other sizes."""
    from edgefuse.runtime import takes_one_token

    tokens, position = (list(method.metadata.input_tensor_meta(i).sizes()) for i in (0, 1))
    if len(tokens) != 2 or tokens[0] != 1 or len(position) != 1:
        raise InputsRefused(index, f"takes tokens of sizes {tokens} and a position input of sizes {position}: not "
                                   "tokens [1, n] with their start position [1] or cache positions [n]")
    return Inputs(positions=position[0] > 1, one_token=takes_one_token(method))


def run_prompt(method, prompt: torch.Tensor, index: int = 0, inputs: Inputs = Inputs(False, False)) -> torch.Tensor:
    """The logits of a prompt at position 0, one call a token for a program that takes one token a call
    (``inputs.one_token``; :func:`edgefuse.runtime.prefill`)."""
    from edgefuse.runtime import prefill

    def step(start: int, end: int) -> torch.Tensor:
        return run_step(method, prompt[:, start:end], start, index, inputs.positions)

    return prefill(step, prompt.shape[1], inputs.one_token)


class StepFailed(RuntimeError):
    """A program failed on a step; ``index`` is the program's place in the list, the message the runtime's."""

    def __init__(self, index: int, tokens: int, position: int, error: Exception) -> None:
        super().__init__(f"failed on {tokens} token(s) at position {position}: {error}")
        self.index, self.tokens, self.position = index, tokens, position


def run_step(method, tokens: torch.Tensor, position: int, index: int = 0, positions: bool = False) -> torch.Tensor:
    """The logits of one call of a loaded method (``LoadedProgram.method``), given each token's position
    with ``positions`` (:class:`Inputs`); :class:`StepFailed` if it fails."""
    try:
        return method.execute(llm_inputs(tokens, position, positions))[0]
    except Exception as error:  # the runtime raises RuntimeError with its log, or ValueError on shapes
        raise StepFailed(index, tokens.shape[1], position, error) from error


def prompt_for(method, prefill: int, decode: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A random prompt of ``prefill`` tokens and ``decode`` single tokens within the vocabulary of the
    program (read from the logits of a one-token probe)."""
    from edgefuse.llm.eager import prompt_and_steps

    vocab = run_step(method, torch.zeros((1, 1), dtype=torch.long), 0, 0, inputs_of(method).positions).shape[-1]
    return prompt_and_steps(vocab, prefill, decode, seed)


@dataclass
class PrefillDecode:
    """Each program's times over the timed rounds: the prefill in ms, and decode in ms per token; the
    logits of each program's last decode step; how the programs took their inputs, the same for all."""

    prefill_ms: list[list[float]]
    decode_ms: list[list[float]]
    last_logits: list[torch.Tensor | None] = field(default_factory=list)
    #: The runs these rounds were pooled from (:func:`pooled`); empty for one run's timing.
    runs: list["PrefillDecode"] = field(default_factory=list)
    #: How every program timed takes its inputs (:func:`inputs_of`); None where nothing was run.
    inputs: Inputs | None = None

    def medians(self, index: int) -> tuple[float, float]:
        """The median prefill ms and decode ms per token of program ``index``."""
        return statistics.median(self.prefill_ms[index]), statistics.median(self.decode_ms[index])

    def ratios(self, index: int = 1, reference: int = 0) -> tuple[float, float]:
        """Program ``index``'s time over ``reference``'s, prefill and decode (below 1 is faster): the ratio of
        their medians, or for pooled runs the geometric mean of each run's (see the module docstring)."""
        if self.runs:
            each = [run.ratios(index, reference) for run in self.runs]
            return tuple(statistics.geometric_mean(phase) for phase in zip(*each))
        (p, d), (p0, d0) = self.medians(index), self.medians(reference)
        return p / p0, d / d0


def time_prefill_decode(methods: Sequence, prompt: torch.Tensor, steps: torch.Tensor, rounds: int,
                        warmup: int, clock: Clock = Clock()) -> PrefillDecode:
    """Time a prefill of ``prompt`` and the decode ``steps`` of each loaded method with the one timer
    (:func:`edgefuse.runtime.timer.alternate`: the methods alternating, ``rounds`` kept rounds after
    ``warmup`` others). A method that takes one token a call prefills one call a token (:func:`run_prompt`);
    methods that take their inputs unlike the first raise :class:`InputsRefused`."""
    decode = steps.shape[0]
    last_logits: list[torch.Tensor | None] = [None for _ in methods]
    inputs = [inputs_of(method, k) for k, method in enumerate(methods)]
    for k, taken in enumerate(inputs):
        if taken != inputs[0]:
            raise InputsRefused(k, f"takes its inputs unlike the first program ({taken} against {inputs[0]}): their "
                                   "prefills would not be the same work")

    def task(k: int) -> Task:
        def prefill_then_decode(mark) -> None:
            logits = run_prompt(methods[k], prompt, k, inputs[k])
            mark("prefill")
            for i in range(decode):
                logits = run_step(methods[k], steps[i], prompt.shape[1] + i, k, inputs[k].positions)
            mark("decode")
            last_logits[k] = logits

        return Task(k, prefill_then_decode)

    samples = alternate([task(k) for k in range(len(methods))], rounds, warmup, clock)
    return PrefillDecode([[us / 1e3 for us in s.wall_us.get("prefill", [])] for s in samples],
                         [[us / 1e3 / max(decode, 1) for us in s.wall_us.get("decode", [])] for s in samples],
                         last_logits, inputs=inputs[0] if inputs else None)


def load_orders(count: int, runs: int) -> list[tuple[int, ...]]:
    """The order in which each of ``runs`` runs loads ``count`` programs: as given, then reversed, in turn."""
    given = tuple(range(count))
    return [given if run % 2 == 0 else given[::-1] for run in range(runs)]


@dataclass
class TimedRun:
    """One run: the programs' indices in the order they were loaded, and their times."""

    order: tuple[int, ...]
    timing: PrefillDecode


def time_runs(load: Callable[[tuple[int, ...]], Sequence], count: int, prefill: int, decode: int, runs: int,
              rounds: int, warmup: int, seed: int = 0, clock: Clock = Clock()) -> list[TimedRun]:
    """Time ``count`` programs in ``runs`` runs of :func:`time_prefill_decode`, each on programs loaded
    afresh in the run's :func:`load_orders` order.

    ``load(order)`` loads the programs of those indices in that order and returns them (each with a
    ``method``) in the same order; the previous run's programs are released before it is called. Times,
    logits and a failing step's :class:`StepFailed` index name a program by its index, whatever the order.
    The prompt (``prefill`` tokens, then ``decode`` single ones) is drawn once, from program 0's vocabulary.
    """
    timed: list[TimedRun] = []
    prompt = steps = None
    for order in load_orders(count, runs):
        loaded = load(order)  # kept until the run ends: a method does not keep its program alive
        methods = [loaded[order.index(k)].method for k in range(count)]
        if prompt is None:
            prompt, steps = prompt_for(methods[0], prefill, decode, seed)
        timed.append(TimedRun(order, time_prefill_decode(methods, prompt, steps, rounds, warmup, clock)))
        del loaded, methods
    return timed


def pooled(runs: Sequence[TimedRun]) -> PrefillDecode:
    """Every timed round of ``runs`` as one :class:`PrefillDecode` whose ratios combine the runs'; the last
    logits and the inputs taken are the last run's."""
    count = len(runs[0].timing.prefill_ms)
    return PrefillDecode(
        [[ms for run in runs for ms in run.timing.prefill_ms[k]] for k in range(count)],
        [[ms for run in runs for ms in run.timing.decode_ms[k]] for k in range(count)],
        list(runs[-1].timing.last_logits),
        [run.timing for run in runs],
        runs[-1].timing.inputs,
    )
