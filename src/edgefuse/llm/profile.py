"""Where an ``export_llm`` program's time goes: per delegate, per op inside XNNPACK, per kernel outside.

The released runtime (ExecuTorch 1.5.1's ``executorch.runtime``) records an ETDump when a program is
loaded with ``enable_etdump=True``: one run per ``execute``, with the time of the whole call
(``Method::execute``), of each kernel instruction (``OPERATOR_CALL``), of each delegate call
(``DELEGATE_CALL``) and, from XNNPACK's own profiler, of each XNNPACK operator inside a delegate (named
as XNNPACK names them, ``Fully Connected (NC, F32) GEMM #3``). :func:`profile_prefill_decode` runs a
program through a prefill and decode steps that way and sums each run by what ran: a kernel by its op
(named from the ``.pte``'s instructions, :func:`~edgefuse.llm.pte.instruction_labels`), an XNNPACK
operator by its kind (the ``#n`` dropped), what a delegate call spends beyond its operators (setting up
and reshaping its runtime for the tokens' count), and what the method spends between instructions.
Recording costs a little per event, so shares and differences are what a profile is for, not the totals.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import torch

#: The group of each row: calls of delegates and what they spend, kernels outside, the method itself.
DELEGATE, INSIDE, OUTSIDE, METHOD = "delegate", "inside", "outside", "method"

_INSTANCE = re.compile(r"\s*#\d+$")


@dataclass
class ProfileRow:
    """One kind of work: its group, its name, calls per prefill and per decode step, and the median
    over rounds of the prefill's ms and of the decode's ms per token."""

    group: str
    name: str
    prefill_calls: int = 0
    decode_calls: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0


@dataclass
class Profile:
    """The rows of one program, keyed by (group, name), and the method's total per prefill and per token."""

    rows: dict[tuple[str, str], ProfileRow] = field(default_factory=dict)
    rounds: int = 0

    def total(self) -> tuple[float, float]:
        row = self.rows.get((METHOD, "Method::execute (whole call)"))
        return (row.prefill_ms, row.decode_ms) if row else (0.0, 0.0)


def _run_rows(run, labels) -> tuple[dict, dict]:
    """The ns and calls of one ETDump run, by (group, name)."""
    ns: dict = defaultdict(int)
    calls: dict = defaultdict(int)
    inside_ns: dict = defaultdict(int)  # by (chain, instruction): the delegate's operators' sum
    instructions_ns = 0
    for event in run.events or []:
        p = event.profile_event
        if p is None:
            continue
        elapsed = p.end_time - p.start_time
        if p.name is None or p.name == "":  # an operator inside a delegate, named by the delegate
            backend = _label(labels, p.chain_index, p.instruction_id)[1] or "delegate"
            key = (INSIDE, f"{backend}: {_INSTANCE.sub('', p.delegate_debug_id_str or str(p.delegate_debug_id_int))}")
            inside_ns[(p.chain_index, p.instruction_id)] += elapsed
        elif p.name == "DELEGATE_CALL":
            backend = _label(labels, p.chain_index, p.instruction_id)[1] or "delegate"
            key = (DELEGATE, f"{backend} calls")
            instructions_ns += elapsed
            overhead = (INSIDE, f"{backend}: the call beyond its operators")
            ns[overhead] += elapsed - inside_ns.pop((p.chain_index, p.instruction_id), 0)
            calls[overhead] += 1
        elif p.name == "OPERATOR_CALL":
            key = (OUTSIDE, _label(labels, p.chain_index, p.instruction_id)[1] or "kernel")
            instructions_ns += elapsed
        elif p.name == "Method::execute":
            key = (METHOD, "Method::execute (whole call)")
            ns[(METHOD, "between instructions")] += elapsed
            calls[(METHOD, "between instructions")] += 1
        else:  # native_call_*: the kernel inside its OPERATOR_CALL, counted there
            continue
        ns[key] += elapsed
        calls[key] += 1
    ns[(METHOD, "between instructions")] -= instructions_ns
    return ns, calls


def _label(labels, chain: int, instruction: int) -> tuple[str, str]:
    if 0 <= chain < len(labels) and 0 <= instruction < len(labels[chain]):
        return labels[chain][instruction]
    return ("", "")


def summarize(runs, labels, decode: int, prompt_calls: int = 1) -> Profile:
    """Sum each round of ETDump ``runs`` (a prefill of ``prompt_calls`` calls, one a token for a program that
    takes one token a call, then ``decode`` steps, round after round) by row; each row's medians over the
    rounds."""
    per_round = prompt_calls + decode
    if not runs or len(runs) % per_round:
        raise ValueError(f"{len(runs)} ETDump runs do not make rounds of a prefill of {prompt_calls} call(s) and "
                         f"{decode} decode steps")
    prefill_ns: dict = defaultdict(list)
    decode_ns: dict = defaultdict(list)
    prefill_calls: dict = {}
    decode_calls: dict = {}
    rounds = len(runs) // per_round
    for r in range(rounds):
        prompt: dict = defaultdict(int)
        prompt_counts: dict = defaultdict(int)
        for run in runs[r * per_round:r * per_round + prompt_calls]:
            ns, calls = _run_rows(run, labels)
            for key in ns:
                prompt[key] += ns[key]
                prompt_counts[key] += calls[key]
        for key in prompt:
            prefill_ns[key].append(prompt[key])
            prefill_calls[key] = prompt_counts[key]
        steps: dict = defaultdict(int)
        step_calls: dict = defaultdict(int)
        for run in runs[r * per_round + prompt_calls:(r + 1) * per_round]:
            ns, calls = _run_rows(run, labels)
            for key in ns:
                steps[key] += ns[key]
                step_calls[key] += calls[key]
        for key in steps:
            decode_ns[key].append(steps[key] / decode)
            decode_calls[key] = step_calls[key] / decode
    profile = Profile(rounds=rounds)
    for key in set(prefill_ns) | set(decode_ns):
        profile.rows[key] = ProfileRow(
            key[0], key[1], prefill_calls.get(key, 0), decode_calls.get(key, 0.0),
            _median_ms(prefill_ns.get(key), rounds), _median_ms(decode_ns.get(key), rounds),
        )
    return profile


def _median_ms(values, rounds: int) -> float:
    if not values:
        return 0.0
    return statistics.median(list(values) + [0] * (rounds - len(values))) / 1e6


def profile_prefill_decode(pte: bytes, prompt: torch.Tensor, steps: torch.Tensor, rounds: int,
                           warmup: int = 1) -> Profile:
    """Run ``pte`` (the LLM kernels registered, threads set) through a prefill of ``prompt`` and the
    decode ``steps``, ``warmup`` + ``rounds`` times with ETDump on; the :class:`Profile` of the timed
    rounds."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    from edgefuse.llm.latency import time_prefill_decode
    from edgefuse.llm.pte import instruction_labels
    from edgefuse.runtime import LoadedProgram

    from edgefuse.llm.latency import inputs_of

    program = LoadedProgram(pte, etdump=True)
    decode = steps.shape[0]
    prompt_calls = prompt.shape[1] if inputs_of(program.method).one_token else 1
    time_prefill_decode([program.method], prompt, steps, rounds, warmup)  # the rounds a timing runs, recorded
    dump = deserialize_from_etdump_flatcc(program.etdump())
    executed = [run for run in dump.run_data if any(
        e.profile_event is not None and e.profile_event.name == "Method::execute" for e in run.events or [])]
    timed = executed[warmup * (prompt_calls + decode):]
    return summarize(timed, instruction_labels(pte), decode, prompt_calls)
