"""The ETDump profile of an ``export_llm`` program (:mod:`edgefuse.llm.profile`): each run summed by what
ran, the rounds split into the prefill and the decode steps. On runs written out by hand, so each sum is
known; the command's test runs it on a real program (tests/tools/test_llm_latency.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def _event(name, instruction, ns, op=None):
    return SimpleNamespace(profile_event=SimpleNamespace(
        name=name, chain_index=0 if instruction >= 0 else -1, instruction_id=max(instruction, 0),
        delegate_debug_id_int=-1, delegate_debug_id_str=op, delegate_debug_metadata=b"", start_time=0,
        end_time=ns))


def _etdump_run(scale):
    """One run: a mean kernel (instruction 0), a delegate (1) with two GEMMs and an add, the method's call."""
    return SimpleNamespace(events=[
        _event("native_call_mean.out", 0, 90 * scale), _event("OPERATOR_CALL", 0, 100 * scale),
        _event(None, 1, 200 * scale, "Fully Connected (NC, F32) GEMM #1"),
        _event(None, 1, 300 * scale, "Fully Connected (NC, F32) GEMM #2"),
        _event(None, 1, 50 * scale, "Add (ND) #1"),
        _event("DELEGATE_CALL", 1, 600 * scale),
        _event("Method::execute", -1, 1000 * scale),
    ])


def test_the_profile_sums_each_run_by_op_and_splits_rounds_into_prefill_and_decode():
    from edgefuse.llm.profile import DELEGATE, INSIDE, METHOD, OUTSIDE, summarize

    labels = [[("kernel", "aten::mean.out"), ("delegate", "XnnpackBackend")]]
    # two rounds of a prefill (10x) and two decode steps (1x and 3x: 2x per token)
    runs = [_etdump_run(s) for s in (10, 1, 3, 10, 1, 3)]
    profile = summarize(runs, labels, decode=2)
    rows = profile.rows
    assert profile.rounds == 2
    assert rows[(OUTSIDE, "aten::mean.out")].prefill_ms == 1000 / 1e6  # the OPERATOR_CALL, not its native_call
    assert rows[(OUTSIDE, "aten::mean.out")].decode_ms == 200 / 1e6
    gemm = rows[(INSIDE, "XnnpackBackend: Fully Connected (NC, F32) GEMM")]
    assert (gemm.prefill_calls, gemm.prefill_ms) == (2, 5000 / 1e6)
    assert rows[(INSIDE, "XnnpackBackend: the call beyond its operators")].prefill_ms == 500 / 1e6
    assert rows[(DELEGATE, "XnnpackBackend calls")].decode_ms == 1200 / 1e6
    assert rows[(METHOD, "between instructions")].prefill_ms == 3000 / 1e6
    assert profile.total() == (10000 / 1e6, 2000 / 1e6)
    with pytest.raises(ValueError, match="do not make rounds"):
        summarize(runs[:4], labels, decode=2)


def test_a_prefill_of_one_call_a_token_is_the_sum_of_its_calls():
    """A program that takes one token a call (optimum's Gemma 3) prefills in as many calls as the prompt
    has tokens: a round is those calls, then the decode steps, and the prefill's row sums its calls."""
    from edgefuse.llm.profile import INSIDE, summarize

    labels = [[("kernel", "aten::mean.out"), ("delegate", "XnnpackBackend")]]
    # two rounds of a three-call prefill (4x, 5x, 6x) and one decode step (1x)
    runs = [_etdump_run(s) for s in (4, 5, 6, 1, 4, 5, 6, 1)]
    profile = summarize(runs, labels, decode=1, prompt_calls=3)
    gemm = profile.rows[(INSIDE, "XnnpackBackend: Fully Connected (NC, F32) GEMM")]
    assert profile.rounds == 2
    assert (gemm.prefill_calls, gemm.prefill_ms) == (6, 15 * 500 / 1e6)
    assert (gemm.decode_calls, gemm.decode_ms) == (2, 500 / 1e6)
    assert profile.total() == (15000 / 1e6, 1000 / 1e6)
