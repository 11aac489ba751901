"""Load a program saved with ``torch.export.save`` without running code the file carries.

``torch.export.load`` (torch 2.13) runs code from the archive wherever it unpickles or evaluates:

- a weight or tensor constant whose entry in ``data/weights/*_weights_config.json`` or
  ``data/constants/*_constants_config.json`` says ``use_pickle`` is read with
  ``torch.load(weights_only=False)``;
- a constant named ``custom_obj_*`` goes through the TorchScript unpickler, one named ``opaque_obj_*``
  through ``pickle.loads``;
- the legacy ``data/weights/MODEL.pt`` and ``data/constants/MODEL.pt``, and the sample inputs
  ``data/sample_inputs/MODEL.pt``, are read with ``weights_only=True`` and, when that fails, again with
  ``weights_only=False``;
- in ``models/MODEL.json``, a node's target (or an operator argument) is looked up as any attribute of
  ``torch`` (``torch.os.system`` resolves), which the program then calls; ``guards_code`` is Python that
  ``ExportedProgram.module()`` executes; every ``expr_str`` (a symbolic size) goes through
  ``sympy.sympify``, which evaluates it;
- ``data/aotinductor/`` holds compiled libraries that ``load_pt2`` loads into the process.

:func:`load` reads the file once, checks those bytes with the zip and JSON parsers (and the sample inputs
with ``torch.load(weights_only=True)``), refuses every entry that would run code unless the caller trusts
the file, and refuses an archive that is not one ``torch.export.save`` writes (not a zip, malformed JSON,
sizes that do not match the stored bytes); only then does it hand the same bytes to ``torch.export.load``.

Running the program is code too: every node must call an operator of :mod:`edgefuse.inputs.pt2_ops`, and an
in-place one may write only a tensor the program made, a buffer or an input, never a parameter or a
constant (the saved program's ``torch.export`` graph writes in place where the model did). And a file is
read within the bounds of :mod:`edgefuse.inputs.pt2_bounds`: the zips (the archive, and the sample inputs'
record inside it, a zip of ``torch.save``) hold stored entries that do not overlap, so that what is read
is no larger than the file; JSON nests within a depth checked before it is parsed; every tensor the
archive declares (weights, constants, sample inputs, the graph's values) has a bounded rank and size.
"""

from __future__ import annotations

import ast
import functools
import io
import itertools
import json
import math
import operator
import re
import struct
import zipfile
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.export.pt2_archive import constants as layout

from edgefuse.inputs import pt2_ops
from edgefuse.inputs.pt2_bounds import (MAX_DEPTH, MAX_RANK, MAX_SUBGRAPH_DEPTH, Limits, check_tensor, past_bytes,
                                      past_fixed)

#: Characters a payload's file name may hold: torch writes ``weight_0``, ``tensor_3``.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
#: A sympy symbol's name in ``Symbol('s77', ...)`` and a ``Float('1.5', ...)`` literal.
#: Its number at the end is at most 6 digits: torch's reader counts up to the number of an unbacked
#: symbol (``u12``, ``zuf3``) one step at a time, so ``u1000000000000`` would never finish loading.
_SYMBOL_NAME = re.compile(r"[A-Za-z_](?:[A-Za-z0-9_]*[A-Za-z_])?[0-9]{0,6}")
#: The largest integer a symbolic size or a guard may hold (a size is an int64), and the largest power:
#: sympy and the guards compute powers of constants, and ``9**9**9**9`` would never finish.
_MAX_INT = 1 << 63
_MAX_EXPONENT = 64
#: sympy and torch functions that raise their first argument to the power of the second (or shift by it).
_POWERS = {"Pow", "PowByNatural", "FloatPow", "LShift", "RShift"}
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|nan)")
_MAX_EXPRESSION = 10_000  # characters of one symbolic size or guard; torch writes a few dozen
#: A string graph input that torch may paste between quotes into a guard: no quote, backslash or line end.
_PLAIN_TEXT = re.compile(r"[ -&(-\[\]-~]*")
#: What a guard may call: the functions torch's guard printer writes (``torch.fx.experimental.symbolic_shapes``
#: runs guards with these names, ``math`` and ``torch`` in scope), and the size methods of an input.
_GUARD_FUNCTIONS = {"max", "min", "abs", "int", "float", "round", "IsNonOverlappingAndDenseIndicator",
                    "cast_symbool_to_symint_guardless"}
_GUARD_ATTRIBUTES = {
    "math": {"floor", "ceil", "trunc", "isnan", "isinf", "sqrt", "inf", "pi", "e"},
    "torch": {"sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_sqrt", "sym_ite"},
}
_SIZE_METHODS = {"size", "stride", "storage_offset", "dim", "numel"}


@dataclass(frozen=True)
class CodeEntry:
    """An entry of the archive that ``torch.export.load`` would run as code, and why; with ``running``, what
    running its program would call that edgefuse does not run from a file."""

    entry: str
    why: str
    running: bool = False

    def __str__(self) -> str:
        return f"{self.entry}: {self.why}"


class ArchiveError(ValueError):
    """The file is not an archive ``torch.export.save`` writes; the message says what is wrong."""


class CodeInArchive(ValueError):
    """The archive holds entries that would run code when loaded; ``entries`` names each and why."""

    def __init__(self, entries: list[CodeEntry]):
        self.entries = entries
        super().__init__("; ".join(map(str, entries)))


def load(data: bytes, trust_code: bool = False, limits: Limits = Limits()) -> ExportedProgram:
    """The program saved in the archive ``data``, read without running code from it unless ``trust_code``.

    Raises :class:`ArchiveError` for bytes that are not a ``torch.export.save`` archive,
    :class:`~edgefuse.runtime.files.TooLarge` for one past a bound of ``limits``, and (unless
    ``trust_code``) :class:`CodeInArchive` for one that would run code or calls an operator edgefuse does
    not run, all before anything is loaded; and what ``torch.export.load`` raises for an archive it then
    rejects.
    """
    entries = check(data, limits)  # a file trusted with its code is still read within the bounds
    if trust_code:
        return torch.export.load(io.BytesIO(data))  # which also reads the format before torch 2.7
    if entries:
        raise CodeInArchive(entries)
    # torch.export.load would log what failed and raise a message that names nothing; its reader raises
    # what failed. It makes the graph's values as fake tensors: their declared sizes allocate nothing.
    from torch.export.pt2_archive._package import load_pt2

    try:
        contents = load_pt2(io.BytesIO(data))
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise ArchiveError(f"torch could not deserialize it ({(lines[0] if lines else type(error).__name__)[:300]})") from None
    if "model" not in contents.exported_programs:
        raise ArchiveError(f"it holds no program named 'model' ({layout.MODELS_FILENAME_FORMAT.format('model')})")
    return contents.exported_programs["model"]


def check(data: bytes, limits: Limits = Limits()) -> list[CodeEntry]:
    """The entries of the archive ``data`` that ``torch.export.load`` would run as code, and the nodes that
    call operators edgefuse does not run.

    Raises :class:`ArchiveError` when ``data`` is not an archive ``torch.export.save`` writes, and
    :class:`~edgefuse.runtime.files.TooLarge` for one past a bound of ``limits``.
    """
    records = _records(data)
    if records is None:
        return [CodeEntry(_LEGACY[1], "an archive in the format of torch before 2.7, whose pickles torch loads "
                                      "with weights_only=False when weights_only=True fails; save it again with "
                                      "this torch")]
    if _text(records, layout.ARCHIVE_FORMAT_PATH) != layout.ARCHIVE_FORMAT_VALUE:
        raise ArchiveError(f"its {layout.ARCHIVE_FORMAT_PATH} does not say {layout.ARCHIVE_FORMAT_VALUE!r}")
    version = _text(records, layout.ARCHIVE_VERSION_PATH)
    if version != layout.ARCHIVE_VERSION_VALUE:
        raise ArchiveError(
            f"archive version {version!r}, where this torch reads version {layout.ARCHIVE_VERSION_VALUE!r}"
        )
    found: list[CodeEntry] = []
    for name in records:
        if name.startswith(layout.AOTINDUCTOR_DIR):
            found.append(CodeEntry(name, "compiled AOTInductor code, which torch.export.load loads into the process"))
    prefix, suffix = layout.MODELS_FILENAME_FORMAT.split("{}")
    models = [name for name in records if name.startswith(layout.MODELS_DIR)]
    if not models:
        raise ArchiveError(f"it holds no program ({layout.MODELS_FILENAME_FORMAT.format('NAME')})")
    declared = _Declared(limits)
    for name in models:
        if not name.endswith(suffix) or len(name) <= len(prefix) + len(suffix):
            raise ArchiveError(f"{name}: not a program's file name ({layout.MODELS_FILENAME_FORMAT.format('NAME')})")
        model = name[len(prefix) : -len(suffix)]
        found += _program(records, name, limits)
        found += _sample_inputs(records, layout.SAMPLE_INPUTS_FILENAME_FORMAT.format(model), declared)
        found += _payloads(records, model, "weights", declared)
        found += _payloads(records, model, "constants", declared)
    return found


class _Declared:
    """The bytes of the tensors an archive holds (weights, constants, sample inputs), each and in total:
    counted by their elements, which a zero stride lets far outnumber the bytes stored."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.total = 0

    def add(self, what: str, shape, element_size: int) -> None:
        self.total += check_tensor(what, shape, element_size, self.limits)
        if self.total > self.limits.max_bytes:
            raise past_bytes(f"the tensors the archive holds, up to {what},", self.total, self.limits)


# --- the zip ------------------------------------------------------------------------------------------


#: The entries of the archive format before torch 2.7, which torch.export.load still reads (unpickling).
_LEGACY = ("version", "serialized_exported_program.json")


def _records(data: bytes, what: str = "") -> dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]] | None:
    """Each record of the zip ``data`` by the name torch gives it (without the archive's root folder); None
    for an archive in the format before torch 2.7. ``what`` names a zip inside the archive in errors.

    Every entry is stored as it is (a compressed one could hold far more than the file) and lies in bytes
    of its own (entries that overlap could repeat the same bytes as often as the directory lists them),
    so that what is read is no larger than the file, itself within ``--max-bytes``.
    """
    def refuse(message: str) -> ArchiveError:
        return ArchiveError(f"{what}: {message}" if what else message)

    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as error:
        raise refuse(f"not a zip archive ({error})") from None
    if not infos:
        raise refuse("an empty zip archive")
    directory = _one_directory(data, infos, refuse)
    if set(_LEGACY) <= {info.filename for info in infos}:
        return None
    # torch's reader takes the folder of the first entry as the archive's root and looks every record up
    # under it; an entry elsewhere, or a name twice, would let two readers see two different archives.
    root = infos[0].filename.split("/", 1)[0]
    records: dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]] = {}
    for info in infos:
        if not info.filename.startswith(root + "/"):
            raise refuse(f"entry {info.filename!r} lies outside the archive's folder {root!r}")
        name = info.filename[len(root) + 1 :]
        if name in records:
            raise refuse(f"entry {info.filename!r} appears twice")
        if info.flag_bits & 0x1:
            raise refuse(f"entry {info.filename!r} is encrypted")
        if info.compress_type != zipfile.ZIP_STORED:
            raise refuse(
                f"entry {info.filename!r} is compressed (method {info.compress_type}); torch.export.save "
                "stores every entry as it is"
            )
        records[name] = (archive, info)
    _apart(data, infos, directory, refuse)
    _same_for_torch(data, records, refuse)
    return records


def _apart(data: bytes, infos: list[zipfile.ZipInfo], directory: int, refuse) -> None:
    """Refuse entries whose bytes (local header, name, extra field, data) overlap one another's, or reach
    past the central directory, which begins at byte ``directory``."""
    spans = []
    for info in infos:
        header = data[info.header_offset : info.header_offset + zipfile.sizeFileHeader]
        if len(header) < zipfile.sizeFileHeader or header[:4] != zipfile.stringFileHeader:
            raise refuse(f"entry {info.filename!r} has no local header where the directory puts it")
        fields = struct.unpack(zipfile.structFileHeader, header)
        start = info.header_offset + zipfile.sizeFileHeader
        end = start + fields[zipfile._FH_FILENAME_LENGTH] + fields[zipfile._FH_EXTRA_FIELD_LENGTH] + info.compress_size
        spans.append((info.header_offset, end, info.filename))
    spans.sort()
    for (_, end, name), (begin, _, following) in zip(spans, spans[1:] + [(directory, None, "the central directory")]):
        if end > begin:
            raise refuse(f"entry {name!r} overlaps {following if following.startswith('the ') else repr(following)}: "
                         "torch.export.save writes every entry in bytes of its own")


def _one_directory(data: bytes, infos: list[zipfile.ZipInfo], refuse) -> int:
    """Refuse a zip that two readers may read as two archives.

    Python's zipfile takes the central directory to end where the end record begins and shifts every
    entry's offset by any difference from the offset the end record gives; torch's reader (miniz) reads
    the directory at that offset. A file whose end record points elsewhere than where the directory lies
    (bytes prepended, a second directory), that counts other entries than the directory holds, that
    carries a comment (so the end record need not be the last bytes) or has bytes before its first
    entry is not one ``torch.export.save`` writes. Returns where the directory begins.
    """
    end = zipfile._EndRecData(io.BytesIO(data))  # what ZipFile itself reads (zip64 fields folded in)
    if end is None:
        raise refuse("not a zip archive (no end record)")
    if end[zipfile._ECD_COMMENT] or end[zipfile._ECD_LOCATION] != len(data) - zipfile.sizeEndCentDir:
        raise refuse("its end record is not the file's last bytes (it carries a comment, or bytes follow it)")
    directory_end = end[zipfile._ECD_LOCATION]
    if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:
        directory_end -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
    offset, size = end[zipfile._ECD_OFFSET], end[zipfile._ECD_SIZE]
    if offset + size != directory_end:
        raise refuse(
            f"its end record puts the central directory at byte {offset}, but the directory lies at byte "
            f"{directory_end - size}: torch's zip reader and Python's would read two different archives"
        )
    if end[zipfile._ECD_ENTRIES_TOTAL] != len(infos) or end[zipfile._ECD_ENTRIES_THIS_DISK] != len(infos):
        raise refuse(f"its end record counts {end[zipfile._ECD_ENTRIES_TOTAL]} entries, but its central "
                     f"directory holds {len(infos)}")
    first = min(info.header_offset for info in infos)
    if first != 0:
        raise refuse(f"{first} bytes come before its first entry")
    return offset


def _same_for_torch(data: bytes, records: dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]], refuse) -> None:
    """Refuse an archive whose entries torch's own zip reader (the one ``torch.export.load`` uses) sees
    otherwise than Python's zipfile, which the checks read: other names, or other bytes under a name.
    Reading every entry with zipfile also checks its local header names what the directory names."""
    try:
        reader = torch._C.PyTorchFileReader(io.BytesIO(data))
        names = reader.get_all_records()
    except RuntimeError as error:
        raise refuse(f"torch's zip reader cannot read it ({str(error).splitlines()[0][:200]})") from None
    if sorted(names) != sorted(records):
        raise refuse("torch's zip reader finds other entries in it than Python's zipfile: "
                     f"{sorted(set(names) ^ set(records))[:5]}")
    for name in records:
        ours = _read(records, name)
        try:
            theirs = reader.get_record(name)
        except RuntimeError as error:
            raise refuse(f"{name} cannot be read by torch's zip reader ({str(error).splitlines()[0][:200]})") from None
        if theirs != ours:
            raise refuse(f"{name} holds other bytes for torch's zip reader than for Python's zipfile")


def _read(records, name: str) -> bytes:
    if name not in records:
        raise ArchiveError(f"it has no {name}")
    archive, info = records[name]
    try:
        return archive.read(info)
    except (zipfile.BadZipFile, ValueError, EOFError, OSError, NotImplementedError) as error:
        raise ArchiveError(f"{name} cannot be read ({error})") from None


def _text(records, name: str) -> str:
    try:
        return _read(records, name).decode()
    except UnicodeDecodeError:
        raise ArchiveError(f"{name} is not text") from None


def _json(records, name: str) -> dict:
    data = _read(records, name)
    depth = _depth(data)
    if depth > MAX_DEPTH:
        raise past_fixed(name, depth, MAX_DEPTH, "JSON nested")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ArchiveError(f"{name} is not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise ArchiveError(f"{name} holds a {type(value).__name__}, not a JSON object")
    return value


#: A JSON string, whose brackets do not nest.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_OPENS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")


def _depth(data: bytes) -> int:
    """How deep the brackets of the JSON text ``data`` nest, counted without parsing it (json.loads
    recurses once a level): its strings dropped, each bracket is +1 or -1, the depth the largest sum."""
    brackets = _JSON_STRING.sub(b"", data).translate(_OPENS, delete=bytes(c for c in range(256) if c not in b"[{]}"))
    # opening brackets count 2, closing 0: the depth after i brackets is their sum less i
    return max(map(operator.sub, itertools.accumulate(brackets), range(1, len(brackets) + 1)), default=0)


# --- payloads: weights and constants ------------------------------------------------------------------


def _payloads(records, model: str, kind: str, declared: _Declared) -> list[CodeEntry]:
    """The pickled payloads of ``kind`` ("weights" or "constants"); checks the others' sizes."""
    directory = layout.WEIGHTS_DIR if kind == "weights" else layout.CONSTANTS_DIR
    legacy = f"{directory}{model}.pt"
    if legacy in records:
        return [CodeEntry(legacy, f"{kind} in the legacy pickled format, which torch unpickles with "
                                  "weights_only=False when weights_only=True fails")]
    config_name = (layout.WEIGHTS_CONFIG_FILENAME_FORMAT if kind == "weights"
                   else layout.CONSTANTS_CONFIG_FILENAME_FORMAT).format(model)
    config = _json(records, config_name).get("config")
    if not isinstance(config, dict):
        raise ArchiveError(f"{config_name} has no \"config\" object")
    found = []
    for fqn, meta in config.items():
        where = f"{config_name} entry {fqn!r}"
        if not isinstance(meta, dict):
            raise ArchiveError(f"{where} is not a JSON object")
        path_name = meta.get("path_name")
        if not isinstance(path_name, str) or not _PLAIN_NAME.fullmatch(path_name):
            raise ArchiveError(f"{where}: path_name {path_name!r} is not the name of a file in {directory}")
        record = directory + path_name
        if kind == "constants" and path_name.startswith(layout.CUSTOM_OBJ_FILENAME_PREFIX):
            found.append(CodeEntry(record, f"constant {fqn!r} is a TorchScript object, which torch unpickles"))
            continue
        if kind == "constants" and path_name.startswith(layout.OPAQUE_OBJ_FILENAME_PREFIX):
            found.append(CodeEntry(record, f"constant {fqn!r} is an opaque object, which torch loads with pickle.loads"))
            continue
        if kind == "constants" and not path_name.startswith(layout.TENSOR_CONSTANT_FILENAME_PREFIX):
            raise ArchiveError(f"{where}: {path_name!r} is no kind of constant torch knows")
        use_pickle = meta.get("use_pickle", False)
        if not isinstance(use_pickle, bool):
            raise ArchiveError(f"{where}: use_pickle is {use_pickle!r}, not true or false")
        if use_pickle:
            what = "weight" if kind == "weights" else "constant"
            found.append(CodeEntry(record, f"{what} {fqn!r} is pickled (use_pickle), which torch.export.load "
                                           "unpickles with weights_only=False"))
            continue
        if record not in records:
            raise ArchiveError(f"{where}: its payload {record} is missing")
        _check_tensor_meta(where, meta.get("tensor_meta"), records[record][1].file_size, declared)
    return found


def _check_tensor_meta(where: str, meta, nbytes: int, declared: _Declared) -> None:
    """Refuse a tensor whose sizes, strides and offset reach past the ``nbytes`` stored for it, and count
    it in what the archive ``declared``."""
    from torch._export.serde.schema import ScalarType
    from torch._export.serde.serialize import deserialize_scalar_type

    if not isinstance(meta, dict):
        raise ArchiveError(f"{where}: tensor_meta is not a JSON object")
    try:
        dtype = deserialize_scalar_type(ScalarType(meta.get("dtype")))
    except (ValueError, KeyError, TypeError):
        raise ArchiveError(f"{where}: dtype {meta.get('dtype')!r} is not one torch knows") from None
    device = meta.get("device")
    if not (isinstance(device, dict) and isinstance(device.get("type"), str)):
        raise ArchiveError(f"{where}: device {device!r} is not a device")
    sizes = _ints(where, "sizes", meta.get("sizes"))
    if len(sizes) > MAX_RANK:
        raise past_fixed(where, len(sizes), MAX_RANK, "rank")
    strides = _ints(where, "strides", meta.get("strides"))
    [offset] = _ints(where, "storage_offset", [meta.get("storage_offset")])
    if len(sizes) != len(strides):
        raise ArchiveError(f"{where}: {len(sizes)} sizes but {len(strides)} strides")
    element = torch._utils._element_size(dtype)  # as torch's reader computes it
    if nbytes % element:
        raise ArchiveError(f"{where}: its {nbytes} stored bytes are not whole {dtype} elements")
    if math.prod(sizes) != 0 and (nbytes != 0 or device["type"] != "meta"):  # else torch reads nothing
        extent = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides)) + 1
        if extent * element > nbytes:
            raise ArchiveError(
                f"{where}: sizes {sizes}, strides {strides} and offset {offset} reach {extent * element} bytes, "
                f"but {nbytes} are stored"
            )
    declared.add(where, sizes, element)


def _ints(where: str, field: str, values) -> list[int]:
    """The integers of a list of ``{"as_int": n}`` (a tensor's static sizes, strides or offset)."""
    if not isinstance(values, list):
        raise ArchiveError(f"{where}: {field} is not a list")
    out = []
    for value in values:
        n = value.get("as_int") if isinstance(value, dict) and len(value) == 1 else None
        if type(n) is not int or not 0 <= n <= _MAX_INT:
            raise ArchiveError(f"{where}: {field} holds {str(value)[:80]}, not a non-negative integer of a size")
        out.append(n)
    return out


# --- sample inputs ------------------------------------------------------------------------------------


def _sample_inputs(records, name: str, declared: _Declared) -> list[CodeEntry]:
    """Sample inputs that load with ``weights_only=True``, as torch first tries, need no more. Their record
    is a zip of its own (``torch.save``'s), checked as the archive is before torch reads it, and each
    tensor in it counts in what the archive ``declared``."""
    data = _read(records, name)
    if not data:
        return []
    if _records(data, name) is None:
        raise ArchiveError(f"{name} is not a zip that torch.save writes")
    try:
        value = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # noqa: BLE001  (the safe unpickler refuses in many ways)
        return [CodeEntry(name, "sample inputs that load only with weights_only=False, which torch then uses "
                                f"({_unpickler_reason(error)})")]
    if not isinstance(value, (tuple, dict)):
        raise ArchiveError(f"{name} holds a {type(value).__name__}, not a tuple of inputs")
    stack = [(value, 1, "")]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            raise past_fixed(f"{name} (its inputs)", depth, MAX_DEPTH, "nesting")
        if isinstance(item, torch.Tensor):
            declared.add(f"{name} input {path or '[0]'}", item.shape, item.element_size())
        elif isinstance(item, (tuple, list)):
            stack += [(v, depth + 1, f"{path}[{i}]") for i, v in enumerate(item)]
        elif isinstance(item, dict):
            stack += [(v, depth + 1, f"{path}[{k!r}]") for k, v in item.items()]
    return []


def _unpickler_reason(error: Exception) -> str:
    """What a ``weights_only`` refusal says the pickle asked for (a global it may not load, mostly)."""
    text = str(error)
    found = re.search(r"[Uu]nsupported (?:global:? )?GLOBAL ([\w.]+)", text)
    if found:
        return f"it asks for {found.group(1)}, which weights_only=True refuses"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:200]


# --- the program: operators, guards, symbolic sizes ---------------------------------------------------


def _program(records, name: str, limits: Limits) -> list[CodeEntry]:
    """Node targets edgefuse does not run, in-place writes into what a program may not write, guard code
    and symbolic sizes that are not plain expressions; the graphs' declared values within ``limits``."""
    program = _json(records, name)
    found = []
    guards = program.get("guards_code", [])
    if not isinstance(guards, list):
        raise ArchiveError(f"{name}: guards_code is not a list")
    for guard in guards:
        if not isinstance(guard, str) or _not_a_guard(guard):
            found.append(CodeEntry(name, f"guards_code line {str(guard)[:80]!r} is not a comparison of input "
                                         "sizes, and ExportedProgram.module() executes it as Python"))
    graph_module = program.get("graph_module")
    graph = graph_module.get("graph", {}) if isinstance(graph_module, dict) else {}
    for value in graph.get("inputs", []) if isinstance(graph, dict) else ():
        text = value.get("as_string") if isinstance(value, dict) else None
        if isinstance(text, str) and not _PLAIN_TEXT.fullmatch(text):
            found.append(CodeEntry(name, f"a string input {text[:80]!r}, which ExportedProgram.module() pastes "
                                         "into Python it executes (its guards)"))
    _check_range_constraints(name, program.get("range_constraints", {}))
    if isinstance(graph, dict):
        signature = graph_module.get("signature")
        _Writes(name, limits, found).graph(graph, _input_origins(signature), depth=0)
    seen: set[tuple[str, str]] = set()
    stack: list = [program]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(value)
            continue
        if not isinstance(value, dict):
            continue
        for key, item in value.items():
            if key == "target" and "inputs" in value and "outputs" in value:
                kind = "node"
            elif key == "as_operator":
                kind = "operator"
            elif key == "expr_str":
                kind = "expression"
            else:
                stack.append(item)
                continue
            if not isinstance(item, str):
                raise ArchiveError(f"{name}: a {key} that is not a string")
            if kind == "node":
                why = _node_refusal(value)
                if why and (kind, item) not in seen:  # one line for each operator refused
                    seen.add((kind, item))
                    found.append(CodeEntry(name, f"node {str(value.get('name'))[:80]!r} calls {item!r}, which "
                                                 f"edgefuse does not run from a file: {why}", running=True))
                continue
            if (kind, item) in seen:
                continue
            seen.add((kind, item))
            if kind == "operator":
                why = _operator_refusal(item)
                if why:
                    found.append(CodeEntry(name, f"an argument names the operator {item!r}, which edgefuse does "
                                                 f"not run from a file: {why}", running=True))
            else:
                why = _not_an_expression(item)
                if why:
                    found.append(CodeEntry(name, why))
    return found


def _check_range_constraints(name: str, constraints) -> None:
    """Refuse a range constraint other than what torch writes: a symbol's name (an unbacked one with a
    number of at most 6 digits: torch counts up to it) and bounds that are integers of a size's range."""
    if not isinstance(constraints, dict):
        raise ArchiveError(f"{name}: range_constraints is not a JSON object")
    from torch.utils._sympy.symbol import SymT, prefix_str

    unbacked = (prefix_str[SymT.UNBACKED_INT], prefix_str[SymT.UNBACKED_FLOAT])
    for symbol, bounds in constraints.items():
        # torch counts up to an unbacked symbol's number (int() of the rest: "1_000_000_000_000" too).
        prefix = next((p for p in unbacked if symbol.startswith(p)), None)
        if prefix is not None and not re.fullmatch(r"[0-9]{1,6}", symbol[len(prefix):]):
            raise ArchiveError(f"{name}: range_constraints names {symbol[:40]!r}, not an unbacked symbol torch "
                               "writes (its prefix and a number of at most 6 digits)")
        ends = [bounds.get(end) for end in ("min_val", "max_val")] if isinstance(bounds, dict) else [bounds]
        if not all(end is None or type(end) is int and abs(end) <= _MAX_INT for end in ends):
            raise ArchiveError(f"{name}: range_constraints gives {symbol[:40]!r} the range {str(bounds)[:80]}, "
                               "not integers of a size (or none)")


def _operator_refusal(target: str) -> str | None:
    """Why a program may not call ``target``, as the archive names it (None when it may): an operator of
    :mod:`edgefuse.inputs.pt2_ops`, and nothing else torch would resolve the name to."""
    if target in pt2_ops.SYMBOLIC:
        return None
    parts = target.split(".")
    if len(parts) == 4 and parts[:3] == ["torch", "ops", "higher_order"]:
        if parts[3] in pt2_ops.HIGHER_ORDER:
            return pt2_ops.HIGHER_ORDER[parts[3]]
        return "a higher-order operator edgefuse does not know"
    if len(parts) == 5 and parts[:2] == ["torch", "ops"] and parts[2] in pt2_ops.FUNCTIONAL:
        namespace, overload = parts[2], f"{parts[3]}.{parts[4]}"
        if (overload in pt2_ops.FUNCTIONAL[namespace] or overload in pt2_ops.IN_PLACE.get(namespace, ())
                or f"{namespace}::{overload}" in pt2_ops.WHEN):
            return None
        return pt2_ops.exception(namespace, overload) or _schema_reason(namespace, overload)
    return "not an operator of torch.ops"


def _schema_reason(namespace: str, overload: str) -> str:
    """Why a registered operator is not in the lists (its schema says), or that this torch has none."""
    name, _, which = overload.partition(".")
    if f"{namespace}::{name}" + ("" if which == "default" else f".{which}") not in _registered():
        return "this torch has no such operator"
    schema = pt2_ops.operator_schema(namespace, overload)
    why = pt2_ops.schema_refusal(schema, pt2_ops.operator_tags(namespace, overload))
    return why or "it is not in edgefuse's list of operators (edgefuse/cli/pt2_ops.py)"


@functools.cache
def _registered() -> frozenset[str]:
    return frozenset(torch._C._dispatch_get_all_op_names())


#: The overloads of :data:`~edgefuse.inputs.pt2_ops.WHEN` by the target a node names them with.
_WHEN = {f"torch.ops.{key.replace('::', '.')}": key for key in pt2_ops.WHEN}


def _node_refusal(node: dict) -> str | None:
    """Why ``node`` may not run (None when it may): its operator, or an argument its operator needs to
    hold a value it does not."""
    target = node["target"]
    why = _operator_refusal(target)
    if why or target not in _WHEN:
        return why
    key = _WHEN[target]
    argument, value, reason = pt2_ops.WHEN[key]
    given = next((entry.get("arg") for entry in node.get("inputs") or () if isinstance(entry, dict)
                  and entry.get("name") == argument), None)
    namespace, overload = key.split("::")
    if given is None:
        default = next(a.default_value for a in pt2_ops.operator_schema(namespace, overload).arguments
                       if a.name == argument)
    else:
        default = None
    actual = _literal(given) if given is not None else default
    if isinstance(actual, (bool, int, float)) and actual == value:
        return None
    return f"it {reason}, and here {argument} is {actual!r}"


def _literal(arg) -> object:
    """The number or boolean an argument holds as a constant (None for anything else)."""
    if isinstance(arg, dict) and len(arg) == 1:
        (key, value), = arg.items()
        if key in ("as_bool", "as_int", "as_float"):
            return value
    return None


@functools.cache
def _schema(target: str):
    """The schema of the ATen (or other listed) operator a node names, or None."""
    parts = target.split(".")
    if len(parts) != 5 or parts[:2] != ["torch", "ops"] or parts[2] not in pt2_ops.FUNCTIONAL:
        return None
    try:
        return pt2_ops.operator_schema(parts[2], f"{parts[3]}.{parts[4]}")
    except RuntimeError:
        return None


def _names(value) -> list[str]:
    """The tensor names an argument or output holds, in order (not those inside a subgraph)."""
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            for key, inner in item.items():
                if key == "as_tensor" and isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    out.append(inner["name"])
                elif key == "as_tensors" and isinstance(inner, list):
                    out += [t["name"] for t in inner if isinstance(t, dict) and isinstance(t.get("name"), str)]
                elif key != "as_graph":
                    stack.append(inner)
    return out


#: Where a tensor comes from, as (kind, name): what an in-place operator may write ("made" by the program,
#: a buffer, an input) or not (a parameter, a constant, one the check cannot trace).
_WRITABLE = ("made", "buffer", "input")
_KINDS = {"parameter": "parameter", "buffer": "buffer", "tensor_constant": "constant", "user_input": "input"}


def _input_origins(signature) -> dict[str, tuple[str, str]]:
    """The top graph's inputs by name, each with where it comes from (the signature's kind)."""
    origins = {}
    for spec in signature.get("input_specs", []) if isinstance(signature, dict) else ():
        if not isinstance(spec, dict) or len(spec) != 1:
            continue
        (kind, body), = spec.items()
        arg = body.get("arg") if isinstance(body, dict) else None
        for tensor in _names(arg) if kind == "user_input" else ([arg["name"]] if isinstance(arg, dict)
                                                                 and isinstance(arg.get("name"), str) else []):
            origins[tensor] = (_KINDS.get(kind, "unknown"), tensor)
    return origins


def _combined(origins) -> tuple[str, str]:
    """One origin for a value that may come from several: the first that may not be written, if any."""
    origins = list(origins)
    return next((o for o in origins if o[0] not in _WRITABLE), origins[0] if origins else ("made", ""))


class _Writes:
    """Walks a program's graphs as torch reads them (its nodes, and the subgraphs higher-order operators
    call, bound to the operands they are called with) and follows where each tensor comes from through
    the operators that return a view of an argument: an in-place operator that writes a parameter, a
    constant or what the walk cannot trace is refused. Bounds the graphs' declared values and their
    nesting on the way."""

    def __init__(self, name: str, limits: Limits, found: list[CodeEntry]):
        self.name, self.limits, self.found = name, limits, found

    def graph(self, graph: dict, origins: dict[str, tuple[str, str]], depth: int) -> list[tuple[str, str]]:
        """Check ``graph`` whose inputs come from ``origins``; the origins of its outputs."""
        if depth > MAX_SUBGRAPH_DEPTH:
            raise past_fixed(f"{self.name}: a subgraph", depth, MAX_SUBGRAPH_DEPTH, "nesting depth")
        self.declared(graph.get("tensor_values"))
        for node in graph.get("nodes") or ():
            if not isinstance(node, dict) or not isinstance(node.get("target"), str):
                continue
            outputs = node.get("outputs") if isinstance(node.get("outputs"), list) else []
            if node["target"].startswith("torch.ops.higher_order."):
                made = self.subgraphs(node, origins, depth)
                names = _names(outputs)
                pairs = zip(names, made + [None] * (len(names) - len(made)))
            else:
                per_output = self.operator(node, origins)
                pairs = ((tensor, origin) for entry, origin in zip(outputs, per_output) for tensor in _names(entry))
            for tensor, origin in pairs:
                origins[tensor] = origin or ("made", tensor)
        return [origins.get(tensor, ("made", tensor)) for tensor in _names(graph.get("outputs"))]

    def operator(self, node: dict, origins) -> list[tuple[str, str] | None]:
        """Check the writes of an operator's node; the origin of each of its outputs (None: made by it)."""
        schema = _schema(node["target"])
        if schema is None:
            return []
        given = {entry.get("name"): entry.get("arg") for entry in node.get("inputs") or () if isinstance(entry, dict)}
        aliased = []  # the origins of the arguments an output may be a view of
        for argument in schema.arguments:
            if argument.alias_info is None or argument.name not in given:
                continue
            origin = _combined(origins.get(t, ("made", t)) for t in _names(given[argument.name]))
            aliased.append(origin)
            if argument.alias_info.is_write and origin[0] not in _WRITABLE:
                what = {"parameter": "the parameter", "constant": "the constant"}.get(origin[0], "the tensor")
                self.found.append(CodeEntry(self.name, (
                    f"node {str(node.get('name'))[:80]!r} calls {node['target']!r}, which writes in place into "
                    f"{what} {origin[1]!r}: a program read from a file may write only tensors it made, its "
                    "buffers and its inputs"), running=True))
        view = _combined(aliased) if aliased else None
        return [view if ret.alias_info is not None else None for ret in schema.returns]

    def subgraphs(self, node: dict, origins, depth: int) -> list[tuple[str, str]]:
        """Check the subgraphs a higher-order operator's node calls, each bound to the tensors that follow
        it among the node's arguments; the origins of their outputs, one for each output position."""
        graphs, operands = [], []
        for entry in node.get("inputs") or ():
            arg = entry.get("arg") if isinstance(entry, dict) else None
            if isinstance(arg, dict) and isinstance(arg.get("as_graph"), dict):
                graphs.append(arg["as_graph"].get("graph"))
                operands = []
            else:
                operands += _names(arg)
        results = []
        for graph in graphs:
            if not isinstance(graph, dict):
                continue
            inner = _names(graph.get("inputs"))
            if len(inner) == len(operands):
                bound = {t: origins.get(o, ("made", o)) for t, o in zip(inner, operands)}
            else:
                bound = {t: ("unknown", t) for t in inner}
            results.append(self.graph(graph, bound, depth + 1))
        return [_combined(column) for column in zip(*results)] if results else []

    def declared(self, values) -> None:
        """Bound the rank and bytes each of a graph's values declares (its hint, for a symbolic size)."""
        for key, meta in values.items() if isinstance(values, dict) else ():
            sizes = meta.get("sizes") if isinstance(meta, dict) else None
            if not isinstance(sizes, list):
                continue
            shape = [_hint(size) for size in sizes]
            check_tensor(f"{self.name}: the graph's value {str(key)[:80]!r}", shape, _element_size(meta.get("dtype")),
                         self.limits)


def _hint(size) -> int:
    """A declared size: ``{"as_int": n}``, or the hint of ``{"as_expr": ...}`` (1 when there is none)."""
    if isinstance(size, dict):
        value = size.get("as_int")
        if value is None and isinstance(size.get("as_expr"), dict):
            hint = size["as_expr"].get("hint")
            value = hint.get("as_int") if isinstance(hint, dict) else None
        if type(value) is int:
            return abs(value)
    return 1


def _element_size(code) -> int:
    """The bytes of one element of the dtype a JSON record names (1 for a code torch does not know)."""
    from torch._export.serde.schema import ScalarType
    from torch._export.serde.serialize import deserialize_scalar_type

    try:
        return torch._utils._element_size(deserialize_scalar_type(ScalarType(code)))
    except (ValueError, KeyError, TypeError):
        return 1


def _allowed_sympy_names() -> set[str]:
    import sympy
    import torch.utils._sympy.functions as functions

    names = set(functions.__all__)
    for name in dir(sympy):
        value = getattr(sympy, name, None)
        if (isinstance(value, type) and issubclass(value, sympy.Basic)) or isinstance(value, sympy.Basic):
            names.add(name)
    return names


_SYMPY_NAMES: set[str] | None = None


def _expression(text: str) -> ast.AST | None:
    """The syntax tree of the Python expression ``text``, or None when it is not one (or is too long)."""
    if len(text) > _MAX_EXPRESSION:
        return None
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _arithmetic(node: ast.AST) -> list[ast.AST] | None:
    """The operands of a sign or of ``+ - * / // % **``; None for any other node, for arithmetic on a
    string, and for a power whose exponent is not a small constant (:func:`_small_power`)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operands = [node.operand]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return [node.left] if _small_power(node.left, node.right) else None
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv,
                                                               ast.Mod)):
        operands = [node.left, node.right]
    else:
        return None
    if any(isinstance(o, ast.Constant) and not isinstance(o.value, (int, float)) for o in operands):
        return None  # 'x' * 10**12
    return operands


def _small_int(node: ast.AST, low: int = -_MAX_EXPONENT) -> bool:
    """Whether ``node`` is an integer from ``low`` to the largest exponent: ``n``, ``-n`` or ``Integer(n)``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Integer" \
            and len(node.args) == 1 and not node.keywords:
        node = node.args[0]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        return type(value) is int and low <= -value <= _MAX_EXPONENT
    return isinstance(node, ast.Constant) and type(node.value) is int and low <= node.value <= _MAX_EXPONENT


def _is_power(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow)) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _POWERS)


def _small_power(base: ast.AST, exponent: ast.AST, low: int = 0) -> bool:
    """Whether ``base ** exponent`` is bounded: the exponent a small integer constant (from ``low``), the
    base not itself a power (``9**9**9**9`` and ``(9**64)**64`` are not)."""
    return _small_int(exponent, low) and not _is_power(base)


def _int_too_large(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) > _MAX_INT


def _not_an_expression(text: str) -> str | None:
    """Why ``text`` is not a plain sympy expression as torch writes them (``srepr``): sympy evaluates it."""
    global _SYMPY_NAMES
    if _SYMPY_NAMES is None:
        _SYMPY_NAMES = _allowed_sympy_names()
    refusal = f"symbolic size {text[:80]!r} is not a plain sympy expression, and torch evaluates it as Python"
    tree = _expression(text)
    if tree is None:
        return refusal
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if _int_too_large(node):
            return refusal
        if isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            continue
        if isinstance(node, ast.Name) and node.id in _SYMPY_NAMES:
            continue
        operands = _arithmetic(node)
        if operands is not None:
            stack += operands
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _SYMPY_NAMES:
            args = list(node.args)
            if node.func.id in _POWERS:
                # Pow(x, Integer(-1)) is how srepr writes a division; Pow(x, Rational(1, 2)) a square root.
                if len(args) != 2 or not (_small_power(args[0], args[1], low=-_MAX_EXPONENT)
                                          or node.func.id == "Pow" and _small_rational(args[1])
                                          and not _is_power(args[0])):
                    return refusal
                args = args[:1]
            if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                pattern = {"Symbol": _SYMBOL_NAME, "Dummy": _SYMBOL_NAME, "Float": _FLOAT_TEXT}.get(node.func.id)
                if pattern is None or not pattern.fullmatch(args[0].value):
                    return refusal
                args = args[1:]
            if any(k.arg is None or not (isinstance(k.value, ast.Constant) and type(k.value.value) in (int, bool))
                   for k in node.keywords):
                return refusal
            stack += args
            continue
        return refusal
    return None


def _small_rational(node: ast.AST) -> bool:
    """``Rational(p, q)`` of small integers: a root, as srepr writes ``sqrt``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Rational"
            and len(node.args) == 2 and not node.keywords and all(_small_int(a) for a in node.args))


def _not_a_guard(text: str) -> bool:
    """Whether ``text`` is more than the guards torch writes: arithmetic and comparisons of numbers and of
    the sizes of inputs (``L['x'].size()[0]``), with the few functions its printer uses."""
    tree = _expression(text)
    if tree is None:
        return True
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if _int_too_large(node):
            return True
        if isinstance(node, ast.Constant) and (
            type(node.value) in (int, float, bool) or (type(node.value) is str and _PLAIN_TEXT.fullmatch(node.value))
        ):
            continue
        if _is_input(node):
            continue
        operands = _arithmetic(node)
        if operands is not None:
            stack += operands
        elif isinstance(node, ast.BoolOp):
            stack += node.values
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            stack.append(node.operand)
        elif isinstance(node, ast.Compare) and all(
            isinstance(op, (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in node.ops
        ):
            stack += [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and not node.keywords:
            func = node.func
            if isinstance(func, ast.Name) and func.id in _GUARD_FUNCTIONS:
                stack += node.args
            elif isinstance(func, ast.Attribute) and _is_module_function(func):
                stack += node.args
            elif isinstance(func, ast.Attribute) and func.attr in _SIZE_METHODS and _is_input(func.value):
                stack += node.args
            else:
                return True
        elif isinstance(node, ast.Attribute) and _is_module_function(node):
            continue
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and type(node.slice.value) is int:
            stack.append(node.value)  # a size by index: L['x'].size()[0]
        else:
            return True
    return False


def _is_module_function(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.attr in _GUARD_ATTRIBUTES.get(node.value.id, ())


def _is_input(node: ast.AST) -> bool:
    """``L['x']``, ``L['x'][0]``, ``L['kw']['k']``: an input by its path, nothing else."""
    while isinstance(node, ast.Subscript):
        if not (isinstance(node.slice, ast.Constant) and type(node.slice.value) in (str, int)):
            return False
        node = node.value
    return isinstance(node, ast.Name) and node.id == "L"
