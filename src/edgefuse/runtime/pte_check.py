"""A ``.pte`` checked as data before the runtime sees it: its headers, its program's tables, and what
loading it takes, within a bound.

The runtime trusts a program's numbers: the memory its methods plan is allocated as declared (a file of
a few kilobytes can ask for gigabytes), a segment is read where its offset says, and a method runs its
instructions wherever their jumps lead. :func:`check_pte` reads the file's identifier (``ET12``), its
extended header (where the flatbuffer ends and the segments begin) and the program's tables, and refuses
a file whose segments lie outside it or overlap, whose references name a segment or inline data it
lacks, whose methods jump back to an earlier instruction (a loop that need not end), or whose bytes and
planned memory together pass a bound. What it returns (each method's inputs, the delegates by backend)
is what a caller decides on.

How the flatbuffer is read, and where it is verified. ExecuTorch's own reader, ``deserialize_pte_binary``,
unpacks the whole object tree: a table is unpacked once for every reference to it, so a file of a few
kilobytes whose vectors all point at one table unpacks into billions of objects, and nothing bounds it.
The generated accessors it is built on (``executorch_flatbuffer.Program``) read only the fields asked
for, each a ``struct`` or ``numpy`` read of the file's bytes that raises past their end (a malformed
offset reads other bytes of the file, never memory outside it); this check reads those, and counts what
it reads against a budget, so no file makes it slow. Verifying every table (each offset, vector and
string within the buffer, the nesting depth, the number of tables) is the flatbuffers verifier's job,
which the runtime runs before it reads anything when it loads with ``Verification.InternalConsistency``,
the default of ``executorch.runtime``: a file whose tables this check misreads is one the runtime refuses.
What neither can see (a corrupt delegate payload inside a valid program) can still crash the runtime, so
a caller runs the first load in a child process (:mod:`edgefuse.runtime.contained`).
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass

from edgefuse.runtime.files import TooLarge
from edgefuse.runtime.log import printable

#: The flatbuffer file identifier of the programs ExecuTorch 1.5 writes and loads, at bytes 4 to 8.
IDENTIFIER = b"ET12"
#: The most tables and vector entries the check reads: a real program has thousands (a Llama of 16
#: layers: a few hundred segments, instructions and named weights); a file of shared references that
#: would make the reading slow is refused when it passes this.
MAX_ENTRIES = 1_000_000
#: The most characters of a name read from the file that a message shows.
NAME_SHOWN = 64


class PteRejected(ValueError):
    """A ``.pte`` is not a program edgefuse hands to the runtime; the message names the file and why."""


@dataclass(frozen=True)
class PteFacts:
    """What a checked program holds: each method's inputs (the ``ScalarType`` number of each tensor input,
    ``None`` for any other value), its delegates by backend id, and the memory its methods plan."""

    methods: dict[str, tuple[int | None, ...]]
    delegates: Counter
    planned_bytes: int


def check_pte(data: bytes, what: str, limit: int, raise_with: str = "") -> PteFacts:
    """The facts of the ``.pte`` ``data`` once its headers, segments, references, jumps and size pass.

    ``what`` names the file in messages; ``limit`` bounds the file's bytes and the memory its methods plan
    together, ``raise_with`` names the option that raises it. Raises :class:`PteRejected`, or
    :class:`~edgefuse.runtime.files.TooLarge` past the bound.
    """
    if len(data) < 8 or data[4:8] != IDENTIFIER:
        found = printable(data[4:8].decode("latin-1")) if len(data) >= 8 else f"{len(data)} bytes in all"
        raise PteRejected(f"{what} is not an ExecuTorch program: no {IDENTIFIER.decode()} identifier at byte 4 "
                          f"({found})")
    program_size, segments_at, segments_size = _layout(data, what)
    tables = _Tables(memoryview(data)[:program_size], what)
    try:
        facts = tables.read(segments_size if segments_at else None)
    except PteRejected:
        raise
    except (struct.error, IndexError, ValueError, TypeError, OverflowError) as error:  # a read past the bytes
        raise PteRejected(f"{what}: its program's tables cannot be read ({type(error).__name__}: {error})") from None
    if len(data) + facts.planned_bytes > limit:
        how = f"; raise it with {raise_with}" if raise_with else ""
        raise TooLarge(f"{what}: its methods plan {facts.planned_bytes:,} bytes of memory beside the file's "
                       f"{len(data):,}, past the bound of {limit:,} on what loading a program takes{how}")
    return facts


def _layout(data: bytes, what: str) -> tuple[int, int, int]:
    """Where the flatbuffer ends, where the segments start (0: no segments) and how many bytes they may
    take, from the extended header when the file has one; :class:`PteRejected` when it lies outside."""
    from executorch.exir._serialize._program import _ExtendedHeader, _get_extended_header

    header = _get_extended_header(data)
    if header is None:
        if data[8:12] == _ExtendedHeader.EXPECTED_MAGIC:
            raise PteRejected(f"{what}: its extended header is malformed (too short, or a length under "
                              f"{_ExtendedHeader.MINIMUM_LENGTH})")
        return len(data), 0, 0
    if not 8 + header.length <= header.program_size <= len(data):
        raise PteRejected(f"{what}: its header gives the program {header.program_size:,} bytes, outside the "
                          f"file's {len(data):,} (truncated?)")
    if header.segment_base_offset == 0:
        return header.program_size, 0, 0
    if not header.program_size <= header.segment_base_offset <= len(data):
        raise PteRejected(f"{what}: its header puts the segments at byte {header.segment_base_offset:,}, outside "
                          f"the file's {len(data):,} after the program's {header.program_size:,} (truncated?)")
    room = len(data) - header.segment_base_offset
    if header.segment_data_size > room:
        raise PteRejected(f"{what}: its header gives the segments {header.segment_data_size:,} bytes where the "
                          f"file holds {room:,} after their start (truncated?)")
    return header.program_size, header.segment_base_offset, header.segment_data_size or room


class _Tables:
    """The program's tables read through ExecuTorch's generated accessors, each count taken from a budget
    of :data:`MAX_ENTRIES` before its entries are read."""

    def __init__(self, flatbuffer: memoryview, what: str) -> None:
        from executorch.exir._serialize._flatbuffer_program import _patch_generated_flatbuffer_aliases
        from executorch.exir._serialize.generated.executorch_flatbuffer.Program import Program

        # The generated modules name their child tables' modules where the accessors expect the classes;
        # ExecuTorch's reader rebinds them, once, before it reads a program: so does this one.
        _patch_generated_flatbuffer_aliases()
        if len(flatbuffer) < 8 or struct.unpack_from("<I", flatbuffer)[0] >= len(flatbuffer):
            raise PteRejected(f"{what}: its program's root table lies outside its {len(flatbuffer):,} bytes")
        self.program = Program.GetRootAs(flatbuffer, 0)
        self.what = what
        self.left = MAX_ENTRIES

    def count(self, length: int, kind: str) -> range:
        """The indices of a vector of ``length`` entries, taken from the budget."""
        self.left -= length
        if self.left < 0:
            raise PteRejected(f"{self.what}: its tables hold more than {MAX_ENTRIES:,} entries (at its {kind}), "
                              "where a real program holds thousands")
        return range(length)

    def read(self, segment_room: int | None) -> PteFacts:
        """The facts, once every segment lies within ``segment_room`` bytes (``None``: the file has no
        segments) and every reference names something the program holds."""
        program = self.program
        segments = self.segments(segment_room)
        constants = program.ConstantSegment()
        if constants is not None:
            self.subsegments(constants, segments, "constant segment")
        for i in self.count(program.NamedDataLength(), "named data"):
            self.segment_index(program.NamedData(i).SegmentIndex(), segments, f"named data {i}")
        inline = program.BackendDelegateDataLength()
        methods: dict[str, tuple[int | None, ...]] = {}
        delegates: Counter = Counter()
        planned = 0
        for i in self.count(program.ExecutionPlanLength(), "methods"):
            plan = program.ExecutionPlan(i)
            name = (plan.Name() or b"").decode("utf-8", "replace")
            methods[name] = self.inputs(plan, name)
            for j in self.count(plan.DelegatesLength(), f"{name}'s delegates"):
                delegates[self.delegate(plan.Delegates(j), segments, inline, name)] += 1
            planned += self.planned(plan, name)
            self.straight(plan, name)
        return PteFacts(methods, delegates, planned)

    def segments(self, room: int | None) -> list[tuple[int, int]]:
        """Each segment's (offset, size), in order, disjoint, within ``room`` bytes."""
        program, spans = self.program, []
        for i in self.count(program.SegmentsLength(), "segments"):
            segment = program.Segments(i)
            spans.append((segment.Offset(), segment.Size()))
        if spans and room is None:
            raise PteRejected(f"{self.what}: its program names {len(spans)} segments but the file has no extended "
                              "header saying where they are")
        end = 0
        for i, (offset, size) in enumerate(spans):
            if offset < end or offset + size > room:
                raise PteRejected(f"{self.what}: its segment {i} ({size:,} bytes at {offset:,}) "
                                  + ("overlaps the one before it" if offset < end else
                                     f"lies outside the {room:,} bytes of segment data (truncated?)"))
            end = offset + size
        return spans

    def segment_index(self, index: int, segments: list, who: str) -> tuple[int, int]:
        if index >= len(segments):
            raise PteRejected(f"{self.what}: its {who} names segment {index}; it has {len(segments)}")
        return segments[index]

    def subsegments(self, table, segments: list, who: str) -> None:
        """Offsets of tensors in one segment (the constants): each within it."""
        offsets = self.count(table.OffsetsLength(), who)
        if not offsets:
            return
        _, size = self.segment_index(table.SegmentIndex(), segments, who)
        beyond = next((int(o) for o in table.OffsetsAsNumpy() if int(o) > size), None)
        if beyond is not None:
            raise PteRejected(f"{self.what}: its {who} has an entry at {beyond:,}, past its segment's {size:,} bytes")

    def delegate(self, delegate, segments: list, inline: int, method: str) -> str:
        """The backend id of ``delegate``, once its payload reference names data the program holds."""
        from executorch.exir._serialize.generated.executorch_flatbuffer.DataLocation import DataLocation

        backend = (delegate.Id() or b"").decode("utf-8", "replace")
        named, processed = f"{method}'s delegate {printable(backend, NAME_SHOWN)}", delegate.Processed()
        if processed is None:
            raise PteRejected(f"{self.what}: its {named} has no payload")
        location, index = processed.Location(), processed.Index()
        if location == DataLocation.SEGMENT:
            self.segment_index(index, segments, named)
        elif location != DataLocation.INLINE:
            raise PteRejected(f"{self.what}: its {named} has its payload at an unknown location ({location})")
        elif index >= inline:
            raise PteRejected(f"{self.what}: its {named} names inline payload {index}; the program holds {inline}")
        return backend

    def inputs(self, plan, method: str) -> tuple[int | None, ...]:
        """The ``ScalarType`` of each tensor input of ``plan`` (``None`` for another kind of value)."""
        from executorch.exir._serialize.generated.executorch_flatbuffer.KernelTypes import KernelTypes
        from executorch.exir._serialize.generated.executorch_flatbuffer.Tensor import Tensor

        kinds, values = [], plan.ValuesLength()
        for i in self.count(plan.InputsLength(), f"{method}'s inputs"):
            index = plan.Inputs(i)
            if not 0 <= index < values:
                raise PteRejected(f"{self.what}: its {method}'s input {i} names value {index}; it has {values}")
            value = plan.Values(index)
            if value.ValType() != KernelTypes.Tensor or value.Val() is None:
                kinds.append(None)
                continue
            tensor = Tensor()
            tensor.Init(value.Val().Bytes, value.Val().Pos)
            kinds.append(tensor.ScalarType())
        return tuple(kinds)

    def planned(self, plan, method: str) -> int:
        """The bytes of memory ``plan`` asks the runtime to allocate for it (its non-constant buffers)."""
        sizes = [int(s) for s in (plan.NonConstBufferSizesAsNumpy() if self.count(
            plan.NonConstBufferSizesLength(), f"{method}'s planned buffers") else ())]
        negative = next((s for s in sizes if s < 0), None)
        if negative is not None:
            raise PteRejected(f"{self.what}: {method} plans a buffer of {negative:,} bytes")
        return sum(sizes)

    def straight(self, plan, method: str) -> None:
        """Refuse a jump back to an instruction at or before the jump: a loop, which the check cannot bound."""
        from executorch.exir._serialize.generated.executorch_flatbuffer.InstructionArguments import (
            InstructionArguments,
        )
        from executorch.exir._serialize.generated.executorch_flatbuffer.JumpFalseCall import JumpFalseCall

        for c in self.count(plan.ChainsLength(), f"{method}'s chains"):
            chain = plan.Chains(c)
            for i in self.count(chain.InstructionsLength(), f"{method}'s instructions"):
                instruction = chain.Instructions(i)
                if instruction.InstrArgsType() != InstructionArguments.JumpFalseCall:
                    continue
                jump, args = JumpFalseCall(), instruction.InstrArgs()
                jump.Init(args.Bytes, args.Pos)
                if jump.DestinationInstruction() <= i:
                    raise PteRejected(f"{self.what}: {method} jumps back from instruction {i} to "
                                      f"{jump.DestinationInstruction()} (a loop, which may never end)")
