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
"""

from __future__ import annotations

import ast
import io
import json
import math
import re
import zipfile
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.export.pt2_archive import constants as layout

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
    """An entry of the archive that ``torch.export.load`` would run as code, and why."""

    entry: str
    why: str

    def __str__(self) -> str:
        return f"{self.entry}: {self.why}"


class ArchiveError(ValueError):
    """The file is not an archive ``torch.export.save`` writes; the message says what is wrong."""


class CodeInArchive(ValueError):
    """The archive holds entries that would run code when loaded; ``entries`` names each and why."""

    def __init__(self, entries: list[CodeEntry]):
        self.entries = entries
        super().__init__("; ".join(map(str, entries)))


def load(path: str, trust_code: bool = False) -> ExportedProgram:
    """The program saved at ``path``, read without running code from it unless ``trust_code``.

    Raises :class:`ArchiveError` for a file that is not a ``torch.export.save`` archive and
    :class:`CodeInArchive` for one that would run code (both before anything is loaded), ``OSError`` when
    the file cannot be read, and what ``torch.export.load`` raises for an archive it then rejects.
    """
    with open(path, "rb") as f:
        data = f.read()
    if trust_code:
        return torch.export.load(io.BytesIO(data))  # which also reads the format before torch 2.7
    entries = check(data)
    if entries:
        raise CodeInArchive(entries)
    # The bytes that were checked, not the file again: it may have changed since. torch.export.load would
    # log what failed and raise a message that names nothing; its reader raises what failed.
    from torch.export.pt2_archive._package import load_pt2

    try:
        contents = load_pt2(io.BytesIO(data))
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise ArchiveError(f"torch could not deserialize it ({(lines[0] if lines else type(error).__name__)[:300]})") from None
    if "model" not in contents.exported_programs:
        raise ArchiveError(f"it holds no program named 'model' ({layout.MODELS_FILENAME_FORMAT.format('model')})")
    return contents.exported_programs["model"]


def check(data: bytes) -> list[CodeEntry]:
    """The entries of the archive ``data`` that ``torch.export.load`` would run as code.

    Raises :class:`ArchiveError` when ``data`` is not an archive ``torch.export.save`` writes.
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
    for name in models:
        if not name.endswith(suffix) or len(name) <= len(prefix) + len(suffix):
            raise ArchiveError(f"{name}: not a program's file name ({layout.MODELS_FILENAME_FORMAT.format('NAME')})")
        model = name[len(prefix) : -len(suffix)]
        found += _program(records, name)
        found += _sample_inputs(records, layout.SAMPLE_INPUTS_FILENAME_FORMAT.format(model))
        found += _payloads(records, model, "weights")
        found += _payloads(records, model, "constants")
    return found


# --- the zip ------------------------------------------------------------------------------------------


#: The entries of the archive format before torch 2.7, which torch.export.load still reads (unpickling).
_LEGACY = ("version", "serialized_exported_program.json")


def _records(data: bytes) -> dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]] | None:
    """Each record of the archive by the name torch gives it (without the archive's root folder); None
    for an archive in the format before torch 2.7."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as error:
        raise ArchiveError(f"not a zip archive ({error})") from None
    if not infos:
        raise ArchiveError("an empty zip archive")
    _one_directory(data, infos)
    if set(_LEGACY) <= {info.filename for info in infos}:
        return None
    # torch's reader takes the folder of the first entry as the archive's root and looks every record up
    # under it; an entry elsewhere, or a name twice, would let two readers see two different archives.
    root = infos[0].filename.split("/", 1)[0]
    records: dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]] = {}
    for info in infos:
        if not info.filename.startswith(root + "/"):
            raise ArchiveError(f"entry {info.filename!r} lies outside the archive's folder {root!r}")
        name = info.filename[len(root) + 1 :]
        if name in records:
            raise ArchiveError(f"entry {info.filename!r} appears twice")
        if info.flag_bits & 0x1:
            raise ArchiveError(f"entry {info.filename!r} is encrypted")
        if info.compress_type != zipfile.ZIP_STORED:
            raise ArchiveError(
                f"entry {info.filename!r} is compressed (method {info.compress_type}); torch.export.save "
                "stores every entry as it is"
            )
        if info.header_offset + info.file_size > len(data):
            raise ArchiveError(f"entry {info.filename!r} says it holds {info.file_size} bytes, past the file's end")
        records[name] = (archive, info)
    _same_for_torch(data, records)
    return records


def _one_directory(data: bytes, infos: list[zipfile.ZipInfo]) -> None:
    """Refuse a zip that two readers may read as two archives.

    Python's zipfile takes the central directory to end where the end record begins and shifts every
    entry's offset by any difference from the offset the end record gives; torch's reader (miniz) reads
    the directory at that offset. A file whose end record points elsewhere than where the directory lies
    (bytes prepended, a second directory), that counts other entries than the directory holds, that
    carries a comment (so the end record need not be the last bytes) or has bytes before its first
    entry is not one ``torch.export.save`` writes.
    """
    end = zipfile._EndRecData(io.BytesIO(data))  # what ZipFile itself reads (zip64 fields folded in)
    if end is None:
        raise ArchiveError("not a zip archive (no end record)")
    if end[zipfile._ECD_COMMENT] or end[zipfile._ECD_LOCATION] != len(data) - zipfile.sizeEndCentDir:
        raise ArchiveError("its end record is not the file's last bytes (it carries a comment, or bytes follow it)")
    directory_end = end[zipfile._ECD_LOCATION]
    if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:
        directory_end -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
    offset, size = end[zipfile._ECD_OFFSET], end[zipfile._ECD_SIZE]
    if offset + size != directory_end:
        raise ArchiveError(
            f"its end record puts the central directory at byte {offset}, but the directory lies at byte "
            f"{directory_end - size}: torch's zip reader and Python's would read two different archives"
        )
    if end[zipfile._ECD_ENTRIES_TOTAL] != len(infos) or end[zipfile._ECD_ENTRIES_THIS_DISK] != len(infos):
        raise ArchiveError(f"its end record counts {end[zipfile._ECD_ENTRIES_TOTAL]} entries, but its central "
                           f"directory holds {len(infos)}")
    first = min(info.header_offset for info in infos)
    if first != 0:
        raise ArchiveError(f"{first} bytes come before its first entry")


def _same_for_torch(data: bytes, records: dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]]) -> None:
    """Refuse an archive whose entries torch's own zip reader (the one ``torch.export.load`` uses) sees
    otherwise than Python's zipfile, which the checks read: other names, or other bytes under a name.
    Reading every entry with zipfile also checks its local header names what the directory names."""
    try:
        reader = torch._C.PyTorchFileReader(io.BytesIO(data))
        names = reader.get_all_records()
    except RuntimeError as error:
        raise ArchiveError(f"torch's zip reader cannot read it ({str(error).splitlines()[0][:200]})") from None
    if sorted(names) != sorted(records):
        raise ArchiveError("torch's zip reader finds other entries in it than Python's zipfile: "
                           f"{sorted(set(names) ^ set(records))[:5]}")
    for name in records:
        ours = _read(records, name)
        try:
            theirs = reader.get_record(name)
        except RuntimeError as error:
            raise ArchiveError(f"{name} cannot be read by torch's zip reader ({str(error).splitlines()[0][:200]})") from None
        if theirs != ours:
            raise ArchiveError(f"{name} holds other bytes for torch's zip reader than for Python's zipfile")


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
    try:
        value = json.loads(_read(records, name))
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ArchiveError(f"{name} is not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise ArchiveError(f"{name} holds a {type(value).__name__}, not a JSON object")
    return value


# --- payloads: weights and constants ------------------------------------------------------------------


def _payloads(records, model: str, kind: str) -> list[CodeEntry]:
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
        _check_tensor_meta(where, meta.get("tensor_meta"), records[record][1].file_size)
    return found


def _check_tensor_meta(where: str, meta, nbytes: int) -> None:
    """Refuse a tensor whose sizes, strides and offset reach past the ``nbytes`` stored for it."""
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
    strides = _ints(where, "strides", meta.get("strides"))
    [offset] = _ints(where, "storage_offset", [meta.get("storage_offset")])
    if len(sizes) != len(strides):
        raise ArchiveError(f"{where}: {len(sizes)} sizes but {len(strides)} strides")
    element = torch._utils._element_size(dtype)  # as torch's reader computes it
    if nbytes % element:
        raise ArchiveError(f"{where}: its {nbytes} stored bytes are not whole {dtype} elements")
    if math.prod(sizes) == 0 or (nbytes == 0 and device["type"] == "meta"):
        return  # nothing to read: torch makes an empty tensor, or a meta one (which holds no values)
    extent = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides)) + 1
    if extent * element > nbytes:
        raise ArchiveError(
            f"{where}: sizes {sizes}, strides {strides} and offset {offset} reach {extent * element} bytes, "
            f"but {nbytes} are stored"
        )


def _ints(where: str, field: str, values) -> list[int]:
    """The integers of a list of ``{"as_int": n}`` (a tensor's static sizes, strides or offset)."""
    if not isinstance(values, list):
        raise ArchiveError(f"{where}: {field} is not a list")
    out = []
    for value in values:
        n = value.get("as_int") if isinstance(value, dict) and len(value) == 1 else None
        if type(n) is not int or n < 0:
            raise ArchiveError(f"{where}: {field} holds {value!r}, not a non-negative integer")
        out.append(n)
    return out


# --- sample inputs ------------------------------------------------------------------------------------


def _sample_inputs(records, name: str) -> list[CodeEntry]:
    """Sample inputs that load with ``weights_only=True``, as torch first tries, need no more."""
    data = _read(records, name)
    if not data:
        return []
    try:
        value = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # noqa: BLE001  (the safe unpickler refuses in many ways)
        return [CodeEntry(name, "sample inputs that load only with weights_only=False, which torch then uses "
                                f"({_unpickler_reason(error)})")]
    if not isinstance(value, (tuple, dict)):
        raise ArchiveError(f"{name} holds a {type(value).__name__}, not a tuple of inputs")
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


def _program(records, name: str) -> list[CodeEntry]:
    """Node targets that are not operators, guard code and symbolic sizes that are not plain expressions."""
    program = _json(records, name)
    found = []
    guards = program.get("guards_code", [])
    if not isinstance(guards, list):
        raise ArchiveError(f"{name}: guards_code is not a list")
    for guard in guards:
        if not isinstance(guard, str) or _not_a_guard(guard):
            found.append(CodeEntry(name, f"guards_code line {str(guard)[:80]!r} is not a comparison of input "
                                         "sizes, and ExportedProgram.module() executes it as Python"))
    graph = program.get("graph_module", {}).get("graph", {}) if isinstance(program.get("graph_module"), dict) else {}
    for value in graph.get("inputs", []) if isinstance(graph, dict) else ():
        text = value.get("as_string") if isinstance(value, dict) else None
        if isinstance(text, str) and not _PLAIN_TEXT.fullmatch(text):
            found.append(CodeEntry(name, f"a string input {text[:80]!r}, which ExportedProgram.module() pastes "
                                         "into Python it executes (its guards)"))
    constraints = program.get("range_constraints", {})
    if not isinstance(constraints, dict):
        raise ArchiveError(f"{name}: range_constraints is not a JSON object")
    from torch.utils._sympy.symbol import SymT, prefix_str

    unbacked = (prefix_str[SymT.UNBACKED_INT], prefix_str[SymT.UNBACKED_FLOAT])
    for symbol in constraints:
        # torch counts up to an unbacked symbol's number (int() of the rest: "1_000_000_000_000" too).
        prefix = next((p for p in unbacked if symbol.startswith(p)), None)
        if prefix is not None and not re.fullmatch(r"[0-9]{1,6}", symbol[len(prefix):]):
            raise ArchiveError(f"{name}: range_constraints names {symbol[:40]!r}, not an unbacked symbol torch "
                               "writes (its prefix and a number of at most 6 digits)")
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
            if key == "target" and "inputs" in value and "outputs" in value or key == "as_operator":
                kind = "operator"
            elif key == "expr_str":
                kind = "expression"
            else:
                stack.append(item)
                continue
            if not isinstance(item, str):
                raise ArchiveError(f"{name}: a {key} that is not a string")
            if (kind, item) in seen:
                continue
            seen.add((kind, item))
            why = _not_an_operator(item) if kind == "operator" else _not_an_expression(item)
            if why:
                found.append(CodeEntry(name, why))
    return found


def _not_an_operator(target: str) -> str | None:
    """Why ``target`` is not an operator a program may call (None when it is one)."""
    from torch._export.serde.serialize import _SYM_OPS, GraphModuleDeserializer, _registered_extension_types

    try:
        resolved = GraphModuleDeserializer().deserialize_operator(target)
    except Exception:  # noqa: BLE001  (an extension namespace torch does not know: torch refuses it too)
        return None
    if isinstance(resolved, str):  # torch resolves nothing and refuses the node itself
        return None
    operators = (torch._ops.OpOverload, torch._ops.HigherOrderOperator, *_registered_extension_types())
    if isinstance(resolved, operators):
        return None
    try:
        if resolved in _SYM_OPS:
            return None
    except TypeError:  # an unhashable object is no symbolic op
        pass
    return (f"a node calls {target!r}, which resolves to {type(resolved).__name__} {resolved!r}, not an "
            "operator: torch would call it when the program runs")


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
