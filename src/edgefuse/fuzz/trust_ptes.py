"""Mutated ``.pte`` programs for :mod:`edgefuse.fuzz.trust`: a tiny program shaped as export_llm's, changed
byte by byte, in the numbers of its flatbuffer tables and header, and in what a hostile file declares.

The starting files are one tiny decoder (tokens and the start position in, logits out, an RMSNorm before
the head) lowered three ways: edgefuse's XNNPACK lowering, ExecuTorch's own, and no delegate. A mutant is
read as ``edgefuse bench-llm`` reads each file before it times it
(:func:`edgefuse.compare.llm_programs.read_llm_program`, then the trial in a child,
:func:`~edgefuse.compare.llm_programs.try_llm_programs`, on a prefill of 4 tokens and 2 decode steps); the
timing itself is not run.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import struct

#: ``bench-llm --max-bytes`` here: a mutant that plans more memory than this is refused, not allocated.
MAX_BYTES = 256 << 20
#: The trial's prefill and decode steps.
PREFILL, DECODE = 4, 2

#: Backend ids a hostile program names for its delegate: those bench-llm does not time, and no backend.
DELEGATE_IDS = ("QnnBackend", "CoreMLBackend", "VulkanBackend", "", "Xnnpack", "XnnpackBackend\x00", "x" * 300)
#: Memory a hostile program plans: past the bound (the first four), at the bound's edge, and next to none.
PLANNED = (3 << 30, 1 << 40, (1 << 63) - 1, MAX_BYTES, MAX_BYTES - (1 << 20), 0, 1)


def tiny_decoder():
    """Tokens ``[1, n]`` and the start position ``[1]`` in, logits over 32 tokens out, with an RMSNorm
    before the head: what ``bench-llm`` times, in miniature."""
    import torch

    class TinyDecoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(32, 16)
            self.position = torch.nn.Embedding(64, 16)
            self.norm = torch.nn.RMSNorm(16, eps=1e-6)
            self.head = torch.nn.Linear(16, 32)

        def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
            return self.head(self.norm(self.embed(tokens) + self.position(input_pos)))

    torch.manual_seed(0)
    return TinyDecoder().eval()


def bases(targets) -> list[bytes]:
    """The tiny decoder lowered by edgefuse for XNNPACK, by ExecuTorch for XNNPACK, and not delegated;
    the runtime's LLM kernels registered and its threads set to one here, once, for the children."""
    from edgefuse.compare.llm_programs import load_llm_kernels
    from edgefuse.runtime import set_threads

    load_llm_kernels()
    set_threads(1)
    return list(_tiny_programs())


@functools.cache
def _tiny_programs() -> tuple[bytes, ...]:
    """:func:`tiny_decoder` lowered three ways, once a process (three lowerings take half a minute)."""
    import torch
    from executorch.exir import to_edge

    from edgefuse.xnnpack.inspect import to_pte
    from edgefuse.xnnpack.lowering import lower, lower_stock

    tokens = torch.export.Dim("tokens", min=1, max=32)
    program = torch.export.export(tiny_decoder(), (torch.zeros(1, 4, dtype=torch.long), torch.tensor([0])),
                                  dynamic_shapes=({1: tokens}, None))
    return to_pte(lower(program)), to_pte(lower_stock(program)), to_pte(to_edge(program))


# --- where the numbers lie --------------------------------------------------------------------------------


def _slot(cls: type, name: str) -> int:
    """The vtable slot of field ``name`` of the flatbuffer table ``cls`` (``executorch.exir.schema``'s
    dataclasses list their fields in the order of program.fbs)."""
    return 4 + 2 * [f.name for f in dataclasses.fields(cls)].index(name)


def _scalar(table, cls: type, name: str, layout: str) -> list[tuple[int, str]]:
    offset = table._tab.Offset(_slot(cls, name))
    return [(table._tab.Pos + offset, layout)] if offset else []


def _vector(table, cls: type, name: str, layout: str) -> list[tuple[int, str]]:
    offset = table._tab.Offset(_slot(cls, name))
    if not offset:
        return []
    start, size = table._tab.Vector(offset), struct.calcsize(layout)
    return [(start + i * size, layout) for i in range(table._tab.VectorLen(offset))]


def number_places(data: bytes) -> list[tuple[int, str]]:
    """Where the numbers the runtime trusts lie in the file (byte, ``struct`` layout): the extended
    header's sizes, each segment's offset and size, each plan's planned memory, inputs and outputs, each
    delegate's data reference."""
    from executorch.exir._serialize._flatbuffer_program import _patch_generated_flatbuffer_aliases
    from executorch.exir._serialize.generated.executorch_flatbuffer.Program import Program
    from executorch.exir.schema import BackendDelegateDataReference, DataSegment, ExecutionPlan

    _patch_generated_flatbuffer_aliases()
    program = Program.GetRootAs(data, 0)
    places = [(12, "<I"), (16, "<Q"), (24, "<Q"), (32, "<Q")] if data[8:12] == b"eh00" else []
    for i in range(program.SegmentsLength()):
        segment = program.Segments(i)
        places += _scalar(segment, DataSegment, "offset", "<Q") + _scalar(segment, DataSegment, "size", "<Q")
    for i in range(program.ExecutionPlanLength()):
        plan = program.ExecutionPlan(i)
        for name, layout in (("non_const_buffer_sizes", "<q"), ("inputs", "<i"), ("outputs", "<i")):
            places += _vector(plan, ExecutionPlan, name, layout)
        for j in range(plan.DelegatesLength()):
            processed = plan.Delegates(j).Processed()
            places += (_scalar(processed, BackendDelegateDataReference, "location", "<b")
                       + _scalar(processed, BackendDelegateDataReference, "index", "<I"))
    return places


# --- mutations ----------------------------------------------------------------------------------------------


def mutate(rng: random.Random, base: bytes, targets) -> bytes:
    """One mutation of a program: its bytes, a number of its tables or header (or any word of its
    flatbuffer moved a little: offsets, lengths, vtable entries), or a hostile plan or delegate id."""
    from edgefuse.fuzz.trust import mutate_bytes

    how = rng.choice(("bytes", "bytes", "number", "number", "word", "hostile"))
    if how == "number":
        at, layout = rng.choice(number_places(base))
        return _written(base, at, layout, rng)
    if how == "word":
        end = struct.unpack_from("<Q", base, 16)[0] if base[8:12] == b"eh00" else len(base)
        at = rng.randrange(0, max(4, min(end, len(base)) - 4)) & ~3
        return _written(base, at, "<I", rng)
    if how == "hostile":
        if rng.random() < 0.5:
            changed = hostile_program(base, delegate_id=rng.choice(DELEGATE_IDS))
        else:
            changed = hostile_program(base, planned=rng.choice(PLANNED))
        if changed is not None:
            return changed
    return mutate_bytes(rng, base)


def _written(data: bytes, at: int, layout: str, rng: random.Random) -> bytes:
    """``data`` with the number at ``at`` replaced: moved a little, the file's size, or an edge value."""
    bits = 8 * struct.calcsize(layout)
    signed = layout[-1].islower()
    (old,) = struct.unpack_from(layout, data, at)
    new = rng.choice((old + rng.choice((-8, -1, 1, 4, 8, 64)), len(data), len(data) + 1, 0, -1, 3 << 30,
                      1 << (bits - 1), (1 << (bits - 1)) - 1, (1 << bits) - 1))
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    edited = bytearray(data)
    struct.pack_into(layout, edited, at, min(max(new, low), high))
    return bytes(edited)


def hostile_program(data: bytes, delegate_id: str | None = None, planned: int | None = None) -> bytes | None:
    """``data`` read with ExecuTorch's deserializer, its first delegate named ``delegate_id`` or its last
    planned buffer declared ``planned`` bytes, and written again; None when the serializer refuses it."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte = deserialize_pte_binary(data)
    plan = pte.program.execution_plan[0]
    if delegate_id is not None and plan.delegates:
        plan.delegates[0].id = delegate_id
    if planned is not None:
        if len(plan.non_const_buffer_sizes) < 2:
            plan.non_const_buffer_sizes.append(0)
        plan.non_const_buffer_sizes[-1] = planned
    try:
        return bytes(serialize_pte_binary(pte, extract_delegate_segments=True))
    except (ValueError, OverflowError, struct.error):
        return None


def read(path: str, folder: str) -> str:
    """What ``edgefuse bench-llm PATH PATH --max-bytes 256MiB --prefill 4 --decode 2`` does before it
    times: the file read and checked, then loaded and run through a prefill and the decode steps in a
    child. "refused" for its exit 2 with a reason, "accepted" when the trial ran; raises otherwise."""
    from edgefuse.compare.llm_programs import read_llm_program, try_llm_programs
    from edgefuse.fuzz.trust import refusal
    from edgefuse.inputs.errors import UsageError

    try:
        try_llm_programs([(path, read_llm_program(path, MAX_BYTES))], PREFILL, DECODE)
    except UsageError as error:
        return refusal(error)
    return "accepted"
