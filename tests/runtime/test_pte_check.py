"""A ``.pte`` handed to ``bench-llm`` (or ``llm_latency --bench-only``) is checked as data before the runtime
sees it, and tried in a child process before it is timed: each hostile file exits 2 with a reason, the
check's refusals before anything is loaded, and a crash of the runtime never takes the command with it.

The hostile files are a tiny program shaped as export_llm's (tokens ``[1, n]`` and the start position in,
logits out), lowered for XNNPACK, with one thing changed: bytes edited where the generated accessors say a
field lies, or the program read with ExecuTorch's deserializer, changed and written again.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest
import torch

from edgefuse import cli
from edgefuse.tools import llm_latency
from edgefuse.inputs.errors import OK, USAGE

pytestmark = pytest.mark.slow

#: The vtable slots (4 + 2 * the field's place in program.fbs) of the fields the edits below change.
PROGRAM_SEGMENTS = 12
PLAN_INPUTS, PLAN_NON_CONST_BUFFER_SIZES = 10, 20
SEGMENT_OFFSET, SEGMENT_SIZE = 4, 6
NAMED_DATA_SEGMENT_INDEX = 6
DATA_REFERENCE_LOCATION, DATA_REFERENCE_INDEX = 4, 6
DELEGATE_PROCESSED = 6
SUBSEGMENT_OFFSETS = 6


class TinyLM(torch.nn.Module):
    """Tokens ``[1, n]`` and the start position ``[1]`` in, logits over 32 tokens out, as an export_llm
    program with a KV cache takes and gives them."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(32, 16)
        self.positions = torch.nn.Embedding(64, 16)
        self.out = torch.nn.Linear(16, 32)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.tokens(tokens) + self.positions(input_pos)))


@pytest.fixture(scope="module")
def program() -> bytes:
    from edgefuse.xnnpack.inspect import to_pte
    from edgefuse.xnnpack.lowering import lower_stock

    torch.manual_seed(0)
    tokens = torch.export.Dim("tokens", min=1, max=32)
    exported = torch.export.export(TinyLM().eval(), (torch.zeros(1, 4, dtype=torch.long), torch.tensor([0])),
                                   dynamic_shapes=({1: tokens}, None))
    return to_pte(lower_stock(exported))


@pytest.fixture
def nothing_loaded(monkeypatch):
    """The calls that would hand a program to the runtime (the trial's child, a load here): none may come."""
    import edgefuse.runtime
    from edgefuse.runtime import contained

    calls = []
    monkeypatch.setattr(contained, "contained", lambda step: calls.append("trial"))
    monkeypatch.setattr(edgefuse.runtime, "LoadedProgram", lambda *args, **kwargs: calls.append("load"))
    return calls


def bench(capsys, *paths, flags=()):
    code = cli.main(["-q", "bench-llm", *map(str, paths), "--prefill", "4", "--decode", "2", "--rounds", "1",
                     "--warmup", "0", *flags])
    out, err = capsys.readouterr()
    return code, out, err


# -- editing a program -----------------------------------------------------------------------------------


def tables(data: bytes):
    """ExecuTorch's generated accessor of the program in ``data``."""
    from executorch.exir._serialize._flatbuffer_program import _patch_generated_flatbuffer_aliases
    from executorch.exir._serialize.generated.executorch_flatbuffer.Program import Program

    _patch_generated_flatbuffer_aliases()
    return Program.GetRootAs(data, 0)


def field(table, slot: int) -> int:
    """Where a scalar field of a flatbuffer table lies in the file."""
    return table._tab.Pos + table._tab.Offset(slot)


def entry(table, slot: int, index: int, size: int) -> int:
    """Where entry ``index`` of a vector field of a flatbuffer table lies in the file."""
    return table._tab.Vector(table._tab.Offset(slot)) + index * size


def patched(data: bytes, at: int, layout: str, value: int) -> bytes:
    edited = bytearray(data)
    struct.pack_into(layout, edited, at, value)
    return bytes(edited)


def rebuilt(data: bytes, change) -> bytes:
    """``data`` read with ExecuTorch's deserializer, ``change(program)``, and written again."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte = deserialize_pte_binary(data)
    change(pte.program)
    return bytes(serialize_pte_binary(pte, extract_delegate_segments=True))


def renamed_delegate(name: str):
    def change(program):
        program.execution_plan[0].delegates[0].id = name
    return change


def renamed_method(program) -> None:
    program.execution_plan[0].name = "decode"


def float_start_position(program) -> None:
    from executorch.exir.scalar_type import ScalarType

    plan = program.execution_plan[0]
    plan.values[plan.inputs[1]].val.scalar_type = ScalarType.FLOAT


def looping(program) -> None:
    """A jump to itself on a false value at the end of the method: it would run until the runtime's limit."""
    from executorch.exir.schema import Bool, EValue, Instruction, JumpFalseCall

    plan = program.execution_plan[0]
    plan.values.append(EValue(Bool(False)))
    chain = plan.chains[0]
    chain.instructions.append(Instruction(JumpFalseCall(len(plan.values) - 1, len(chain.instructions))))


def start_position_no_tensor(program) -> None:
    from executorch.exir.schema import EValue, Int

    plan = program.execution_plan[0]
    plan.values.append(EValue(Int(0)))
    plan.inputs[1] = len(plan.values) - 1


def without_payload(data: bytes) -> bytes:
    """The delegate's entry for its payload emptied in its table's vtable: the table names no payload."""
    delegate = _plan(data).Delegates(0)._tab
    vtable = delegate.Pos - struct.unpack_from("<i", data, delegate.Pos)[0]
    return patched(data, vtable + DELEGATE_PROCESSED, "<H", 0)


def flipped(data: bytes) -> bytes:
    """The program with the XNNPACK payload's header magic flipped: the runtime aborts on its log of it."""
    from executorch.exir._serialize._program import _extract_delegate_payload

    edited = bytearray(data)
    edited[data.index(_extract_delegate_payload(data, "XnnpackBackend")) + 4] ^= 0xFF
    return bytes(edited)


def _segment(data, i):
    return tables(data).Segments(i)


def _plan(data):
    return tables(data).ExecutionPlan(0)


def _processed(data):
    return _plan(data).Delegates(0).Processed()


#: Each file the check refuses: how it is made from the program, and what the refusal says.
REFUSED = {
    "not-a-program": (lambda d: b"QnnBackend", "is not an ExecuTorch program: no ET12 identifier at byte 4"),
    "truncated-in-the-program": (lambda d: d[:1000],
                                 "its header gives the program 2,024 bytes, outside the file's 1,000"),
    "truncated-before-the-segments": (lambda d: d[:2030], "puts the segments at byte 2,048, outside the file's 2,030"),
    "truncated-in-the-segments": (lambda d: d[:9000], "gives the segments 9,344 bytes where the file holds 6,952"),
    "malformed-extended-header": (lambda d: patched(d, 12, "<I", 4), "its extended header is malformed"),
    "segments-without-a-header": (lambda d: patched(d, 8, "<I", 0),
                                  "names 4 segments but the file has no extended header"),
    "root-outside": (lambda d: patched(d, 0, "<I", 1 << 30), "its program's root table lies outside its 2,024 bytes"),
    "unreadable-tables": (lambda d: patched(d, struct.unpack_from("<I", d)[0], "<i", -(1 << 30)),
                          "its program's tables cannot be read (error: "),
    "too-many-entries": (lambda d: patched(d, entry(tables(d), PROGRAM_SEGMENTS, -1, 4), "<I", 1 << 30),
                         "its tables hold more than 1,000,000 entries (at its segments)"),
    "segment-outside": (lambda d: patched(d, field(_segment(d, 3), SEGMENT_SIZE), "<Q", 1 << 20),
                        "its segment 3 (1,048,576 bytes at 9,216) lies outside the 9,344 bytes of segment data"),
    "segments-overlap": (lambda d: patched(d, field(_segment(d, 1), SEGMENT_OFFSET), "<Q", 0),
                         "its segment 1 (944 bytes at 0) overlaps the one before it"),
    "constant-past-its-segment": (lambda d: patched(d, entry(tables(d).ConstantSegment(), SUBSEGMENT_OFFSETS, 2, 8),
                                                    "<Q", 1 << 20),
                                  "its constant segment has an entry at 1,048,576, past its segment's 6,144 bytes"),
    "named-data-without-its-segment": (lambda d: patched(d, field(tables(d).NamedData(0), NAMED_DATA_SEGMENT_INDEX),
                                                         "<I", 99), "its named data 0 names segment 99; it has 4"),
    "payload-without-its-segment": (lambda d: patched(d, field(_processed(d), DATA_REFERENCE_INDEX),
                                                      "<I", 99),
                                    "its forward's delegate XnnpackBackend names segment 99; it has 4"),
    "payload-inline-but-none-there": (lambda d: patched(d, field(_processed(d), DATA_REFERENCE_LOCATION), "<b", 0),
                                      "its forward's delegate XnnpackBackend names inline payload 1; the program "
                                      "holds 0"),
    "payload-at-an-unknown-location": (lambda d: patched(d, field(_processed(d), DATA_REFERENCE_LOCATION), "<b", 7),
                                       "its forward's delegate XnnpackBackend has its payload at an unknown "
                                       "location (7)"),
    "a-delegate-without-payload": (without_payload, "its forward's delegate XnnpackBackend has no payload"),
    "input-without-its-value": (lambda d: patched(d, entry(_plan(d), PLAN_INPUTS, 0, 4), "<i", 999),
                                "its forward's input 0 names value 999; it has 13"),
    "negative-planned-memory": (lambda d: patched(d, entry(_plan(d), PLAN_NON_CONST_BUFFER_SIZES, 1, 8), "<q", -1),
                                "forward plans a buffer of -1 bytes"),
    "3-gb-planned-memory": (lambda d: patched(d, entry(_plan(d), PLAN_NON_CONST_BUFFER_SIZES, 1, 8), "<q", 3 * 10**9),
                            "its methods plan 3,000,000,000 bytes of memory beside the file's 11,392, past the "
                            "bound of 2,147,483,648 on what loading a program takes; raise it with --max-bytes"),
    "a-loop": (lambda d: rebuilt(d, looping),
               "forward jumps back from instruction 3 to 3 (a loop, which may never end)"),
    "qnn-delegate": (lambda d: rebuilt(d, renamed_delegate("QnnBackend")),
                     "runs on QNN (a QnnBackend delegate): this times programs that run on this CPU"),
    "another-delegate": (lambda d: rebuilt(d, renamed_delegate("CoreMLBackend")),
                         "holds a delegate of CoreMLBackend: this times programs whose delegates are XNNPACK's"),
    "a-delegate-named-to-move-the-cursor": (lambda d: rebuilt(d, renamed_delegate("\x1b[2JEvil")),
                                            "holds a delegate of \\x1b[2JEvil:"),
    "no-forward": (lambda d: rebuilt(d, renamed_method), "has no forward method (it has decode)"),
    "a-float-start-position": (lambda d: rebuilt(d, float_start_position),
                               "its forward takes (long tensor, float tensor), not export_llm's tokens and start "
                               "position"),
    "a-start-position-that-is-no-tensor": (lambda d: rebuilt(d, start_position_no_tensor),
                                           "its forward takes (long tensor, a value), not export_llm's"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_a_hostile_pte_is_refused_with_its_reason_before_anything_loads(kind, program, tmp_path, capsys,
                                                                        nothing_loaded):
    make, reason = REFUSED[kind]
    good, hostile = tmp_path / "good.pte", tmp_path / "hostile.pte"
    good.write_bytes(program)
    hostile.write_bytes(make(program))
    code, out, err = bench(capsys, good, hostile)
    assert code == USAGE, err
    assert f"edgefuse bench-llm: {hostile}" in err and reason in err, err
    assert "Traceback" not in err and "\x1b" not in err and out == ""
    assert nothing_loaded == []


def test_the_refused_files_are_real_programs_but_for_their_one_change(program):
    # The check reads what the runtime would: the unchanged program passes it, with the facts each edit changes.
    from edgefuse.runtime.pte_check import check_pte

    facts = check_pte(program, "program.pte", 1 << 31)
    assert facts.methods == {"forward": (4, 4)} and dict(facts.delegates) == {"XnnpackBackend": 1}
    assert (len(program), facts.planned_bytes) == (11_392, 6_272)
    assert tables(program).SegmentsLength() == 4 and struct.unpack_from("<Q", program, 16)[0] == 2024


def test_files_that_are_not_regular_missing_or_too_large_are_refused_before_reading(program, tmp_path, capsys,
                                                                                     nothing_loaded):
    good = tmp_path / "good.pte"
    good.write_bytes(program)
    fifo = tmp_path / "fifo.pte"
    os.mkfifo(fifo)
    cases = [((good, fifo), (), f"{fifo} is a FIFO, not a regular file: a .pte is read from a regular file only"),
             ((good, tmp_path / "missing.pte"), (), f"{tmp_path / 'missing.pte'}: no such file"),
             ((good, good), ("--max-bytes", "1000"), "holds 11,392 bytes, past the bound of 1,000; raise it with "
                                                      "--max-bytes"),
             # the file fits, but not with the memory its method plans
             ((good, good), ("--max-bytes", str(len(program) + 100)), "its methods plan 6,272 bytes of memory "
                                                                        "beside the file's 11,392, past the bound")]
    for paths, flags, reason in cases:
        code, _, err = bench(capsys, *paths, flags=flags)
        assert code == USAGE and reason in err, err
    assert nothing_loaded == []


#: Runs the command given as its arguments, passes its stderr through, and prints its exit code and peak
#: resident memory (kilobytes: the largest peak of the command or of any child it waited for). A process
#: started from this small one counts its own peak; one started from the test's worker would count the
#: worker's peak as its own, since Linux gives a program started by vfork and exec the peak of the memory
#: it was started from.
PEAK_OF_COMMAND = """
import os, subprocess, sys
command = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(command.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def test_a_program_declaring_3_gb_is_refused_before_the_memory_is_taken(program, tmp_path):
    """Without the check the runtime allocates what the plan says (3 GB for this 11 KB file)."""
    good, hostile = tmp_path / "good.pte", tmp_path / "hostile.pte"
    good.write_bytes(program)
    hostile.write_bytes(REFUSED["3-gb-planned-memory"][0](program))
    done = subprocess.run([sys.executable, "-c", PEAK_OF_COMMAND, sys.executable, "-m", "edgefuse", "-q", "bench-llm",
                           str(good), str(hostile)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    code, peak = map(int, done.stdout.split())
    assert code == USAGE and "plan 3,000,000,000 bytes" in done.stderr, done.stderr
    assert peak < 1_500_000, peak  # kilobytes: the command and its children, at their peak


# -- a program that passes the check, and crashes the runtime ---------------------------------------------


def test_a_flipped_byte_in_the_xnnpack_payload_exits_2_naming_the_signal_not_crashing(program, tmp_path, capsys):
    good, damaged = tmp_path / "good.pte", tmp_path / "flipped.pte"
    good.write_bytes(program)
    damaged.write_bytes(flipped(program))
    code, out, err = bench(capsys, good, damaged)
    assert code == USAGE, err
    assert f"the runtime crashed (SIGABRT) loading {damaged}: terminate called after throwing" in err, err
    assert "Traceback" not in err and out == ""


def test_a_program_that_passes_is_tried_and_timed(program, tmp_path, capsys):
    good = tmp_path / "good.pte"
    good.write_bytes(program)
    code, out, err = bench(capsys, good, good)
    assert code == OK, err
    assert out.splitlines()[2].split()[:2] == ["stock", str(good)]


def test_bench_only_refuses_a_prepared_program_that_crashes_the_runtime(program, tmp_path, capsys):
    (tmp_path / "stock.pte").write_bytes(program)
    (tmp_path / "edgefuse.pte").write_bytes(flipped(program))
    (tmp_path / "manifest.json").write_text(json.dumps({
        "max_seq_length": 128, "max_context_length": 128,
        "pairs": [{"size": "128x2", "dtype": "fp32", "stock": "stock.pte", "edgefuse": "edgefuse.pte"}]}))
    code = llm_latency.main(["-q", "--bench-only", str(tmp_path), "--prefill", "4", "--decode", "2", "--rounds",
                             "1", "--warmup", "0", "--repeats", "0"])
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert f"the runtime crashed (SIGABRT) loading {tmp_path / 'edgefuse.pte'}" in err, err


def test_a_table_the_check_does_not_read_is_verified_by_the_runtime_in_the_child(program, tmp_path, capsys):
    # The first operator's name made to run a megabyte past the file: the runtime's flatbuffers verifier
    # refuses the program (an error, in the child) before it reads any of it.
    data = bytearray(program)
    operator = _plan(program).Operators(0)
    name = operator._tab.Indirect(operator._tab.Pos + operator._tab.Offset(4))
    struct.pack_into("<I", data, name, 1 << 20)
    good, damaged = tmp_path / "good.pte", tmp_path / "damaged.pte"
    good.write_bytes(program)
    damaged.write_bytes(bytes(data))
    code, out, err = bench(capsys, good, damaged)
    assert code == USAGE and out == "", err
    assert f"{damaged} does not load in executorch.runtime" in err and "Verification failed" in err, err
