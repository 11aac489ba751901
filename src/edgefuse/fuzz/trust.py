"""Hostile and mutated files for edgefuse's four readers of files other people send: ``.pt2`` archives,
reproducers, ``export-llm`` configs (:mod:`edgefuse.fuzz.trust_configs`) and ``.pte`` programs handed to
``bench-llm`` (:mod:`edgefuse.fuzz.trust_ptes`).

Each hostile builder writes a file the way an attacker would: a payload that creates a marker file when
it runs, placed where ``torch.export.load``, the fuzzer's renderer, hydra or the runtime would run it, or a
write aimed at a decoy file outside the output folder. :func:`measure` mutates valid files (bytes,
structure, hostile edits) and feeds each to the reader edgefuse uses, up to the command's expensive part,
in a child process forked for that file and killed at a deadline (:func:`feed`). It counts files
accepted and refused (exit 2 with a reason), escapes (any other exception, a refusal without a reason,
a crash of the child), hangs, markers that appeared and changes in the folder outside. ``python -m
edgefuse.fuzz.trust`` prints the counts and the time per reader and exits 1 unless the last four are 0.
"""

from __future__ import annotations

import argparse
import ast
import copy
import io
import json
import os
import pickle
import pprint
import random
import re
import shutil
import struct
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# --- payloads -----------------------------------------------------------------------------------------


def code_that_touches(marker: str) -> str:
    """Python that creates ``marker``: what every payload here runs if anything runs it."""
    return f"open({marker!r}, 'w').close()"


class Payload:
    """Unpickling this runs :func:`code_that_touches` and gives the value of the expression ``then``: an
    attacker's pickle (with ``then`` the tensor the archive should hold, the load goes on unnoticed)."""

    def __init__(self, marker: str, then: str = "None"):
        self.marker, self.then = marker, then

    def __reduce__(self):
        return eval, (f"[{code_that_touches(self.marker)}, {self.then}][1]",)


def pickled(marker: str, then: str = "None") -> bytes:
    return pickle.dumps(Payload(marker, then), protocol=2)


def torch_saved(value) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


# --- archives -----------------------------------------------------------------------------------------


def records(data: bytes) -> dict[str, bytes]:
    """The entries of a zip by their full names, in order."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def zipped(entries: dict[str, bytes]) -> bytes:
    """A zip of ``entries``, stored as ``torch.export.save`` stores them."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _root(entries: dict[str, bytes]) -> str:
    return next(iter(entries)).split("/", 1)[0] + "/"


def _one(entries: dict[str, bytes], suffix: str) -> str:
    return next(name for name in entries if name.endswith(suffix))


def _edit_json(entries: dict[str, bytes], suffix: str, edit: Callable[[dict, dict], None]) -> dict[str, bytes]:
    """A copy of ``entries`` whose JSON entry ending in ``suffix`` ``edit(json, entries)`` changed."""
    entries = dict(entries)
    name = _one(entries, suffix)
    value = json.loads(entries[name])
    edit(value, entries)
    entries[name] = json.dumps(value).encode()
    return entries


def _pickled_weight(entries, marker):
    def edit(config, entries):
        meta = next(iter(config["config"].values()))
        meta["use_pickle"] = True
        entries[_root(entries) + "data/weights/" + meta["path_name"]] = pickled(marker)

    return _edit_json(entries, "_weights_config.json", edit)


def _constant(path_name: str, payload: Callable[[str], bytes], use_pickle: bool):
    def build(entries, marker):
        def edit(config, entries):
            config["config"]["planted"] = {"path_name": path_name, "is_param": False, "use_pickle": use_pickle,
                                           "tensor_meta": None}
            entries[_root(entries) + "data/constants/" + path_name] = payload(marker)

        return _edit_json(entries, "_constants_config.json", edit)

    return build


def _legacy(kind: str):
    def build(entries, marker):
        entries = dict(entries)
        entries[_root(entries) + f"data/{kind}/model.pt"] = torch_saved({"planted": Payload(marker)})
        return entries

    return build


def _sample_inputs(entries, marker):
    entries = dict(entries)
    entries[_one(entries, "data/sample_inputs/model.pt")] = torch_saved(((Payload(marker),), {}))
    return entries


def _first_node(program: dict) -> dict:
    return program["graph_module"]["graph"]["nodes"][0]


def _node_target(entries, marker):
    def edit(program, _):
        node = copy.deepcopy(_first_node(program))
        node.update(target="torch.os.system", name="planted",
                    inputs=[{"name": "command", "arg": {"as_string": f"touch {marker}"}, "kind": 1}])
        program["graph_module"]["graph"]["nodes"].insert(0, node)

    return _edit_json(entries, "models/model.json", edit)


def _operator_argument(entries, marker):
    def edit(program, _):
        node = _first_node(program)
        node["inputs"].append({"name": "planted", "arg": {"as_operator": "torch.os.system"}, "kind": 1})

    return _edit_json(entries, "models/model.json", edit)


def _guards_code(entries, marker):
    return _edit_json(entries, "models/model.json", lambda p, _: p.__setitem__("guards_code", [code_that_touches(marker)]))


def _string_input(entries, marker):
    """A string graph input that breaks out of the quotes torch's input guards put it between."""
    def edit(program, _):
        text = f"' or {code_that_touches(marker)} or '"
        program["graph_module"]["graph"]["inputs"].append({"as_string": text})
        program["graph_module"]["signature"]["input_specs"].append({"user_input": {"arg": {"as_string": text}}})

    return _edit_json(entries, "models/model.json", edit)


def _symbolic_size(entries, marker):
    def edit(program, _):
        values = program["graph_module"]["graph"]["tensor_values"]
        meta = next(iter(values.values()))
        meta["sizes"][0] = {"as_expr": {"expr_str": f"exec({code_that_touches(marker)!r})", "hint": {"as_int": 2}}}

    return _edit_json(entries, "models/model.json", edit)


def _older_format(entries, marker):
    """The archive format before torch 2.7 (entries at the top of the zip), which torch.export.load still
    reads when the current format fails to load, with a pickled state dict."""
    from torch._export.serde.schema import SCHEMA_VERSION

    return {
        "version": ".".join(map(str, SCHEMA_VERSION)).encode(),
        "serialized_exported_program.json": entries[_one(entries, "models/model.json")],
        "serialized_state_dict.pt": torch_saved({"planted": Payload(marker)}),
        "serialized_constants.pt": torch_saved({}),
        "serialized_example_inputs.pt": entries[_one(entries, "data/sample_inputs/model.pt")],
    }


def _aotinductor(entries, marker):
    entries = dict(entries)
    entries[_root(entries) + "data/aotinductor/model/model.wrapper.so"] = b"\x7fELF planted library"
    return entries


#: Every way a .pt2 may carry code for torch.export.load (torch 2.13), with the entry edgefuse names.
HOSTILE_ARCHIVES: dict[str, tuple[Callable, str]] = {
    "pickled-weight": (_pickled_weight, "is pickled (use_pickle)"),
    "pickled-constant": (_constant("tensor_planted", pickled, True), "is pickled (use_pickle)"),
    "torchscript-constant": (_constant("custom_obj_planted", pickled, True), "is a TorchScript object"),
    "opaque-constant": (_constant("opaque_obj_planted", pickled, True), "pickle.loads"),
    "legacy-weights": (_legacy("weights"), "legacy pickled format"),
    "legacy-constants": (_legacy("constants"), "legacy pickled format"),
    "sample-inputs": (_sample_inputs, "sample inputs that load only with weights_only=False"),
    "node-target": (_node_target, "'torch.os.system'"),
    "operator-argument": (_operator_argument, "'torch.os.system'"),
    "guards-code": (_guards_code, "guards_code"),
    "string-input": (_string_input, "a string input"),
    "symbolic-size": (_symbolic_size, "is not a plain sympy expression"),
    "aotinductor": (_aotinductor, "compiled AOTInductor code"),
    "older-format": (_older_format, "the format of torch before 2.7"),
}
#: The entry each hostile archive's refusal names.
HOSTILE_ENTRIES = {
    "pickled-weight": "data/weights/", "pickled-constant": "data/constants/tensor_planted",
    "torchscript-constant": "data/constants/custom_obj_planted", "opaque-constant": "data/constants/opaque_obj_planted",
    "legacy-weights": "data/weights/model.pt", "legacy-constants": "data/constants/model.pt",
    "sample-inputs": "data/sample_inputs/model.pt", "node-target": "models/model.json",
    "operator-argument": "models/model.json", "guards-code": "models/model.json", "string-input": "models/model.json", "symbolic-size": "models/model.json",
    "aotinductor": "data/aotinductor/", "older-format": "serialized_exported_program.json",
}


def hostile_archive(kind: str, base: bytes, marker: str) -> bytes:
    """``base`` (a saved program) with the payload of ``kind`` planted."""
    build, _ = HOSTILE_ARCHIVES[kind]
    return zipped(build(records(base), marker))


def _split_zip(data: bytes) -> tuple[bytes, bytes, bytes]:
    """A zip without a comment as (its entries, its central directory, its end record)."""
    end = data[-22:]
    assert end[:4] == b"PK\x05\x06", "no end record where a zip without a comment has it"
    size, offset = struct.unpack("<II", end[12:20])
    return data[:offset], data[offset : offset + size], end


def confused_archive(base: bytes, marker: str) -> bytes:
    """One file that holds two archives: the hostile "pickled-weight" one for torch's reader and ``base``
    for Python's zipfile. Its end record points at the hostile central directory, while its size makes
    zipfile read the clean directory that lies just before the end record (zipfile takes the directory
    to end where the end record begins, and shifts every entry's offset by the difference).

    Layout: hostile entries, clean entries, hostile directory, clean directory (offsets written so that
    zipfile's shift lands on the clean entries), end record.
    """
    hostile_entries, hostile_directory, _ = _split_zip(hostile_archive("pickled-weight", base, marker))
    clean_entries, clean_directory, clean_end = _split_zip(zipped(records(base)))
    assert len(hostile_directory) == len(clean_directory)  # the same names: torch reads as many bytes
    shift = len(hostile_entries) - len(hostile_directory)  # where the clean entries lie, less zipfile's shift
    directory = bytearray(clean_directory)
    i = 0
    while i < len(directory):
        assert directory[i : i + 4] == b"PK\x01\x02"
        name, extra, comment = struct.unpack("<HHH", directory[i + 28 : i + 34])
        (offset,) = struct.unpack("<I", directory[i + 42 : i + 46])
        directory[i + 42 : i + 46] = struct.pack("<I", offset + shift)
        i += 46 + name + extra + comment
    end = bytearray(clean_end)
    end[16:20] = struct.pack("<I", len(hostile_entries) + len(clean_entries))  # torch reads the directory here
    return hostile_entries + clean_entries + hostile_directory + bytes(directory) + bytes(end)


def saved_programs() -> dict[str, bytes]:
    """Small saved programs to start from: a one-layer built-in model, and a module with a tensor constant
    and a dynamic dim (a constants config and symbolic sizes)."""
    import torch

    from edgefuse.inputs.models import build_model

    module, inputs = build_model("tiny-llama", layers=1, seq_len=4)
    programs = {"tiny-llama": torch.export.export(module, tuple(inputs))}

    class WithConstant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(8))
            self.table = torch.arange(8.0)  # a plain tensor attribute: a lifted constant

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight + self.table

    batch = torch.export.Dim("batch", min=1, max=16)
    programs["constant-dynamic"] = torch.export.export(
        WithConstant(), (torch.randn(2, 8),), dynamic_shapes=({0: batch},)
    )
    out = {}
    for name, program in programs.items():
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        out[name] = buffer.getvalue()
    return out


# --- archives that call what edgefuse does not run, or reach past a bound -------------------------------


def saved(module, inputs: tuple, dynamic_shapes=None) -> dict[str, bytes]:
    """The entries of ``module`` exported on ``inputs`` and saved with ``torch.export.save``."""
    import torch

    buffer = io.BytesIO()
    torch.export.save(torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes), buffer)
    return records(buffer.getvalue())


def program_edited(data: bytes, edit: Callable[[dict], None]) -> bytes:
    """A copy of the archive ``data`` whose program JSON (``models/model.json``) ``edit(program)`` changed."""
    return zipped(_edit_json(records(data), "models/model.json", lambda program, _: edit(program)))


def _nodes(entries: dict[str, bytes], edit: Callable[[list], None]) -> bytes:
    """The archive of ``entries`` with ``edit(nodes)`` applied to its program's top-level nodes."""
    return zipped(_edit_json(entries, "models/model.json", lambda p, _: edit(p["graph_module"]["graph"]["nodes"])))


def _node(nodes: list, target: str) -> dict:
    return next(node for node in nodes if node["target"] == target)


def file_writing_archive(target: str) -> bytes:
    """A program that maps the file ``target`` (``aten.from_file`` with shared=True) and copies its input
    into it: running it writes 64 bytes of the attacker's choosing into a file the user owns. No pickle."""
    import torch

    class CopiesIntoAFile(torch.nn.Module):
        def forward(self, x):
            mapped = torch.ones(16)  # becomes the mapped file
            mapped.view(2, 8).copy_(x)
            return x + mapped.sum()

    def edit(nodes):
        node = _node(nodes, "torch.ops.aten.ones.default")
        node["target"] = "torch.ops.aten.from_file.default"
        node["inputs"] = [{"name": "filename", "arg": {"as_string": target}, "kind": 1},
                          {"name": "shared", "arg": {"as_bool": True}, "kind": 1},
                          {"name": "size", "arg": {"as_int": 16}, "kind": 1}]

    return _nodes(saved(CopiesIntoAFile(), (torch.full((2, 8), 7.0),)), edit)


def huge_ones_archive(elements: int) -> bytes:
    """A program whose ``aten.ones`` makes ``elements`` floats, while the sizes its JSON declares for that
    value stay 8: only running the program (or propagating its shapes) shows the real size."""
    import torch

    class AddsOnes(torch.nn.Module):
        def forward(self, x):
            return x + torch.ones(8)

    def edit(nodes):
        _node(nodes, "torch.ops.aten.ones.default")["inputs"][0]["arg"] = {"as_ints": [elements]}

    return _nodes(saved(AddsOnes(), (torch.randn(2, 8),)), edit)


def huge_weight_archive(base: bytes, elements: int, weights: int = 1) -> bytes:
    """``base`` with its first ``weights`` weights declared as ``elements`` elements of stride 0 each: the
    bytes stored still cover them (one element), but any copy of one has all of them."""
    def edit(config, _):
        for entry in list(config["config"].values())[:weights]:
            entry["tensor_meta"]["sizes"], entry["tensor_meta"]["strides"] = [{"as_int": elements}], [{"as_int": 0}]

    return zipped(_edit_json(records(base), "_weights_config.json", edit))


def endless_loop_archive() -> bytes:
    """A program with a ``while_loop`` whose condition is always true."""
    import torch
    from torch._higher_order_ops.while_loop import while_loop

    class Loops(torch.nn.Module):
        def forward(self, x):
            _, y = while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 2), (torch.tensor(0), x))
            return y

    def edit(nodes):
        cond = _node(nodes, "torch.ops.higher_order.while_loop")["inputs"][0]["arg"]["as_graph"]["graph"]
        test = _node(cond["nodes"], "torch.ops.aten.lt.Scalar")
        test["target"], test["inputs"][1]["arg"] = "torch.ops.aten.ge.Scalar", {"as_int": 0}  # i >= 0, i grows

    return _nodes(saved(Loops(), (torch.randn(2, 8),)), edit)


def slow_archive(width: int) -> bytes:
    """A program that multiplies two ``width`` x ``width`` matrices expanded from one number: a few
    hundred MB, within the byte bound, and 2 * width**3 operations (minutes at 12288)."""
    import torch

    class Multiplies(torch.nn.Module):
        def forward(self, x):
            square = x.expand(width, width)
            return (square @ square).sum()

    return zipped(saved(Multiplies(), (torch.ones(1, 1),)))


def inflated_inputs_archive(base: bytes, how: str, size: int = 1 << 20, copies: int = 256) -> bytes:
    """``base`` whose sample inputs (a zip of ``torch.save``) hold ``copies`` tensors of ``size`` zero
    bytes in far fewer: "compressed" (deflated entries) or "overlapping" (every storage entry of the
    directory points at the bytes of the first)."""
    import torch

    inputs = torch_saved(((tuple(torch.zeros(size // 4) for _ in range(copies)),), {}))
    inner = records(inputs)
    if how == "compressed":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in inner.items():
                archive.writestr(name, data)
        inflated = buffer.getvalue()
    else:
        inflated = _overlapping(inner)
    entries = records(base)
    entries[_one(entries, "data/sample_inputs/model.pt")] = inflated
    return zipped(entries)


def _overlapping(entries: dict[str, bytes]) -> bytes:
    """A stored zip of ``entries`` where every storage record (``.../data/N``) but the first is only a
    directory entry pointing at the first one's local header and bytes."""
    storages = [name for name in entries if re.search(r"/data/\d+$", name)]
    body, directory, end = _split_zip(zipped({n: d for n, d in entries.items() if n not in storages[1:]}))
    first = next(entry for name, entry in _directory_entries(directory) if name == storages[0])
    copies = b"".join(_entry_named(first, name) for name in storages[1:])
    count = len(entries)
    end = bytearray(end)
    end[8:16] = struct.pack("<HHI", count, count, len(directory) + len(copies))
    return body + directory + copies + bytes(end)


def _directory_entries(directory: bytes):
    """(name, entry) of each central directory entry."""
    i = 0
    while i < len(directory):
        name, extra, comment = struct.unpack("<HHH", directory[i + 28 : i + 34])
        yield directory[i + 46 : i + 46 + name].decode(), directory[i : i + 46 + name + extra + comment]
        i += 46 + name + extra + comment


def _entry_named(entry: bytes, name: str) -> bytes:
    """A central directory ``entry`` (without extra field or comment) under another name."""
    head = bytearray(entry[:46])
    head[28:30] = struct.pack("<H", len(name))
    (old,) = struct.unpack("<H", entry[28:30])
    return bytes(head) + name.encode() + entry[46 + old :]


# --- reproducers --------------------------------------------------------------------------------------

#: Text an attacker puts into a string field of a reproducer's SPEC; {code} is the payload.
INJECTIONS = (
    "view(1)\n{code}\n#",
    "reshape; {code}; x = x.view",
    "float32); {code}; (torch.float32",
    '"""\n{code}\n"""',
    "' + str({code}) + '",
    "llama\n        {code}\n",
    "x.pow(2)\n        {code}\n        v = v",
)


def reproducer_texts(seed: int = 0, count: int = 12) -> list[str]:
    """Reproducers the fuzzer writes, for cases of a seeded run: one case each, a batch, a hostile and an
    XNNPACK one."""
    from edgefuse.fuzz.check import Finding
    from edgefuse.fuzz.generate import generate
    from edgefuse.fuzz.reproducer import reproducer_text

    specs = [generate(seed, i) for i in range(count)]
    texts = [reproducer_text(Finding("mismatch", ("capture", "aten", False), "(a case)", s)) for s in specs]
    texts.append(reproducer_text(Finding("mismatch", ("edge", "qnn", False), "(a batch)", specs[0], tuple(specs[:4]))))
    texts.append(reproducer_text(Finding("hostile-mismatch", ("strip-meta-all", "qnn", False), "x", specs[1],
                                         damage=(("strip", "mean"),))))
    texts.append(reproducer_text(Finding("xnnpack-mismatch", ("xnnpack", "edgefuse", False), "x", specs[2])))
    return texts


def spec_literal(text: str):
    """The ``SPEC`` literal of a reproducer's text, and the (first, last) line numbers of its assignment."""
    from edgefuse.fuzz.reproducer import _eval_literal

    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SPEC" for t in node.targets):
            return _eval_literal(node.value), (node.lineno, node.end_lineno)
    raise ValueError("no SPEC")


def with_spec(text: str, literal) -> str:
    """``text`` with its ``SPEC`` replaced by ``literal``, written the way the fuzzer writes it."""
    from edgefuse.fuzz.reproducer import _printable

    _, (first, last) = spec_literal(text)
    lines = text.splitlines()
    spec = "SPEC = " + pprint.pformat(_printable(literal), width=110, sort_dicts=False)
    return "\n".join(lines[: first - 1] + [spec] + lines[last:]) + "\n"


def string_fields(literal) -> list[tuple]:
    """The paths to every string field of a SPEC literal (``__type__`` tags included)."""
    return [path for path in _paths(literal) if isinstance(_get(literal, path), str)]


def replaced(literal, path: tuple, value):
    """A copy of ``literal`` with the item at ``path`` set to ``value`` (tuples stay tuples)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(literal, dict):
        out = dict(literal)
        out[key] = replaced(literal[key], rest, value)
        return out
    items = list(literal)
    items[key] = replaced(literal[key], rest, value)
    return tuple(items)


def injected(text: str, path: tuple, injection: str, marker: str) -> str:
    """A reproducer whose string field at ``path`` holds ``injection`` with code that touches ``marker``."""
    literal, _ = spec_literal(text)
    return with_spec(text, replaced(literal, path, injection.format(code=code_that_touches(marker))))


# --- mutations ----------------------------------------------------------------------------------------


#: Bytes a mutation inserts now and then: the starts of what a reader must not take for data.
INSERTED = (b"\x00", b"\xff" * 8, b"PK\x03\x04", b"${", b"!!python/object:", b"&a [*a, *a]", b"\n_target_: ", b"ET12",
            b"\xef\xbf\xbd", b'"""', b"\\", b"\n# @package _global_\n")


def mutate_bytes(rng: random.Random, data: bytes, start: int = 0) -> bytes:
    """``data`` with bytes from ``start`` on flipped (1 to 16 of them), cut short, or with bytes inserted."""
    data = bytearray(data)
    how = rng.choice(("flip", "flip", "flip", "truncate", "insert"))
    if how == "truncate":
        return bytes(data[: rng.randrange(start, len(data))])
    if how == "insert":
        at = rng.randrange(start, len(data) + 1)
        data[at:at] = rng.choice(INSERTED) if rng.random() < 0.5 else rng.randbytes(rng.randrange(1, 64))
        return bytes(data)
    for _ in range(rng.choice((1, 1, 2, 4, 16))):
        i = rng.randrange(start, len(data))
        data[i] ^= rng.randrange(1, 256)
    return bytes(data)


def _random_value(rng: random.Random, marker: str):
    return rng.choice((
        lambda: rng.choice(INJECTIONS).format(code=code_that_touches(marker)),
        lambda: rng.choice((0, 1, -1, 2, 3, 7, 64, 65, 1 << 20, -(1 << 40), 10 ** 30)),
        lambda: rng.choice((0.0, -1e-3, 1e300, float("nan"), float("inf"), 2.5)),
        lambda: None,
        lambda: rng.choice((True, False)),
        lambda: rng.choice(("", "float32", "input", "view", "llama", "torch.os.system", "Symbol('s0')")),
        lambda: (),
        lambda: (1, 2, 3, 4, 5, 6),
        lambda: {"__type__": rng.choice(("Cast", "CaseSpec", "Nope"))},
        lambda: [1, "a"],
        lambda: {},
    ))()


def _as_json(value):
    """``value`` with tuples as lists, as JSON holds them."""
    if isinstance(value, (tuple, list)):
        return [_as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    return value


def _paths(value, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*path, key))
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            out += _paths(item, (*path, i))
    return out


def _json_set(value, path: tuple, new):
    """``value`` (JSON: dicts and lists) with the item at ``path`` set to ``new``, in place."""
    if not path:
        return new
    target = value
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return value


def mutate_archive(rng: random.Random, base: bytes, marker: str) -> bytes:
    """One mutation of a saved program: byte flips, a JSON edit, a record changed, or a hostile payload."""
    entries = records(base)
    how = rng.choice(("flip", "flip", "json", "json", "json", "record", "hostile", "zip"))
    if how == "flip":
        return mutate_bytes(rng, base)
    if how == "zip":
        return _mutate_zip(rng, base, marker)
    if how == "hostile":
        return hostile_archive(rng.choice(list(HOSTILE_ARCHIVES)), base, marker)
    names = list(entries)
    if how == "record":
        name = rng.choice(names)
        change = rng.choice(("drop", "truncate", "grow", "garbage", "rename"))
        if change == "drop":
            del entries[name]
        elif change == "truncate":
            entries[name] = entries[name][: rng.randrange(len(entries[name]) + 1)]
        elif change == "grow":
            entries[name] = entries[name] + bytes(rng.randrange(1, 64))
        elif change == "garbage":
            entries[name] = rng.randbytes(rng.randrange(1, 256))
        else:
            entries[rng.choice(("other/", "", "../")) + name.split("/", 1)[1]] = entries.pop(name)
        return zipped(entries)
    name = rng.choice([n for n in names if n.endswith(".json")])
    value = json.loads(entries[name])
    paths = _paths(value)
    for _ in range(rng.choice((1, 1, 2, 3))):
        path = rng.choice(paths)
        value = _json_set(value, path, _as_json(_random_value(rng, marker)) if rng.random() < 0.8 else rng.choice((
            {"as_int": rng.choice((0, 1, 1 << 40, -3))}, True, "torch.ops.aten.add.Tensor", [],
        )))
        paths = _paths(value)
    entries[name] = json.dumps(value).encode()
    return zipped(entries)


def _mutate_zip(rng: random.Random, base: bytes, marker: str) -> bytes:
    """A change of the zip's structure: bytes prepended, a second central directory (two readers, two
    archives), or the end record's directory offset or entry count changed."""
    data = zipped(records(base))
    entries, directory, end = _split_zip(data)
    change = rng.choice(("prepend", "second-directory", "offset", "count"))
    if change == "prepend":
        return rng.choice((b"#!/bin/sh\n", bytes(rng.randrange(1, 512)), rng.randbytes(64))) + data
    if change == "second-directory":
        return confused_archive(base, marker)
    end = bytearray(end)
    if change == "offset":
        (offset,) = struct.unpack("<I", end[16:20])
        end[16:20] = struct.pack("<I", max(0, offset + rng.choice((-46, -1, 1, 46, -offset))))
    else:
        (count,) = struct.unpack("<H", end[10:12])
        new = max(0, count + rng.choice((-1, 1, 5)))
        end[8:12] = struct.pack("<HH", new, new)
    return entries + directory + bytes(end)


def mutate_reproducer(rng: random.Random, text: str, marker: str) -> str:
    """One mutation of a reproducer: byte flips in its SPEC, or edits of SPEC's fields."""
    literal, (first, _) = spec_literal(text)
    if rng.random() < 0.25:
        start = len("\n".join(text.splitlines()[: first - 1]))
        return mutate_bytes(rng, text.encode(), start).decode("utf-8", errors="replace")
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        paths = _paths(literal)[1:]
        path = rng.choice(paths)
        if rng.random() < 0.1 and isinstance(path[-1], str):  # a field renamed or dropped
            parent = _get(literal, path[:-1])
            parent = {(k + "_x" if k == path[-1] and rng.random() < 0.5 else k): v for k, v in parent.items()
                      if k != path[-1] or rng.random() < 0.5}
            literal = replaced(literal, path[:-1], parent)
        else:
            literal = replaced(literal, path, _random_value(rng, marker))
    return with_spec(text, literal)


def _get(value, path: tuple):
    for key in path:
        value = value[key]
    return value


# --- hostile edits of an archive's program ------------------------------------------------------------

#: Targets outside the operator allowlist (:mod:`edgefuse.inputs.pt2_ops`): operators it refuses with a
#: reason, operators it never lists, and names that are no operator at all.
FOREIGN_TARGETS = (
    "torch.ops.aten.from_file.default", "torch.ops.aten._print.default", "torch.ops.aten.set_.source_Storage",
    "torch.ops.aten._copy_from.default", "torch.ops.aten.normal_.default", "torch.ops.aten.nonzero.default",
    "torch.ops.aten.empty.memory_format", "torch.ops.profiler._record_function_enter.default",
    "torch.ops.aten.save.default", "builtins.exec", "torch.os.system", "torch.ops.higher_order.cond",
)
#: Sizes past every bound, and sizes at the edges of the integer types.
HUGE_SIZES = (1 << 40, 1 << 62, (1 << 63) - 1, 1 << 64, -1, 0, 1 << 31, 10 ** 30)


def _hostile_edit(rng: random.Random, entries: dict[str, bytes], targets) -> dict[str, bytes]:
    """A node's target swapped for one outside the allowlist, a huge size declared for a tensor the
    program holds or makes, or a weight of a huge shape and zero stride."""
    how = rng.choice(("target", "size", "weight"))
    if how == "weight":
        def grow(config, _):
            entry = rng.choice(list(config["config"].values()))
            entry["tensor_meta"]["sizes"] = [{"as_int": rng.choice(HUGE_SIZES)}]
            entry["tensor_meta"]["strides"] = [{"as_int": 0}]

        return _edit_json(entries, "_weights_config.json", grow)

    def edit(program, _):
        graph = program["graph_module"]["graph"]
        if how == "target":
            calls = [node for node in graph["nodes"] if node["target"].startswith("torch.ops.")]
            node = rng.choice(calls)
            node["target"] = rng.choice(FOREIGN_TARGETS)
            if node["target"] == "torch.ops.aten.from_file.default":
                node["inputs"] = [{"name": "filename", "arg": {"as_string": targets.decoy}, "kind": 1},
                                  {"name": "shared", "arg": {"as_bool": True}, "kind": 1},
                                  {"name": "size", "arg": {"as_int": 16}, "kind": 1}]
        else:
            meta = rng.choice(list(graph["tensor_values"].values()))
            if meta["sizes"]:
                meta["sizes"][rng.randrange(len(meta["sizes"]))] = {"as_int": rng.choice(HUGE_SIZES)}
            else:
                meta["sizes"].append({"as_int": rng.choice(HUGE_SIZES)})

    return _edit_json(entries, "models/model.json", edit)


def hostile_programs(targets) -> list[bytes]:
    """Archives built to do harm when their program runs: one writes ``targets.decoy`` through a mapped
    file, one makes a tensor far larger than its graph says, one loops for ever, one computes for minutes."""
    return [file_writing_archive(targets.decoy), huge_ones_archive(1 << 40), endless_loop_archive(),
            slow_archive(12288)]


# --- the measure --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """Where a run looks for harm: ``marker``, the file every payload creates when it runs (in the output
    folder); ``outside``, a folder the reader may not write, its working folder while it reads; ``decoy``, a
    file in ``outside`` that the hostile files aim their writes at."""

    marker: str
    outside: str
    decoy: str


@dataclass(frozen=True)
class Reader:
    """One reader of files other people send, as the measure feeds it: ``bases(targets)`` gives the valid
    (and hostile) files to start from, ``mutate(rng, base, targets)`` one mutant, ``read(path, folder)``
    what the command does with it up to its expensive part, in a child: "refused" (exit 2 with a reason),
    "accepted", or "not-run" (a reproducer whose module torch cannot build: the replay exits 2), raising
    for anything else. ``seconds`` bounds one file's read, well above the reader's own bound."""

    name: str
    suffix: str
    bases: Callable[[Targets], list[bytes]]
    mutate: Callable[[random.Random, bytes, Targets], bytes]
    read: Callable[[str, str], str]
    seconds: float


@dataclass
class Counts:
    """What became of the files fed to one reader, and how long it took."""

    files: int = 0
    accepted: int = 0
    refused: int = 0  # exit 2 with a reason
    not_run: int = 0  # reproducers accepted whose module torch cannot build: the replay says no check ran, exit 2
    escapes: list[str] = field(default_factory=list)  # another exception, a refusal without a reason, a crash
    hangs: list[str] = field(default_factory=list)  # still reading at the file's deadline
    code_run: list[str] = field(default_factory=list)  # the marker file appeared
    writes_outside: list[str] = field(default_factory=list)  # the outside folder changed
    seconds: float = 0.0

    @property
    def bad(self) -> int:
        return len(self.escapes) + len(self.hangs) + len(self.code_run) + len(self.writes_outside)

    def line(self, what: str) -> str:
        extra = f" (of which the replay runs no check, exit 2: {self.not_run})" if self.not_run else ""
        return (f"{what:<12} files {self.files}: accepted {self.accepted}{extra}, refused {self.refused}, escapes "
                f"{len(self.escapes)}, hangs {len(self.hangs)}, code run {len(self.code_run)}, writes outside "
                f"{len(self.writes_outside)}; {self.seconds:.1f} s")


def refusal(error: BaseException) -> str:
    """"refused" for an error the command turns into exit 2 with a reason; an error without one raises."""
    if not str(error).strip():
        raise RuntimeError(f"a refusal without a reason: {type(error).__name__}()") from error
    return "refused"


#: The ``--max-seconds`` an archive is read within here: the command's default is 60.
ARCHIVE_SECONDS = 10.0


def read_archive(path: str, folder: str) -> str:
    """What ``edgefuse report PATH --max-seconds 10 --max-bytes 1GiB`` does before its work: resolve the
    MODEL (the archive checked, loaded, its program run once on its saved inputs in a child)."""
    from edgefuse.inputs.errors import UsageError
    from edgefuse.inputs.modelspec import resolve
    from edgefuse.inputs.pt2_bounds import Limits

    try:
        resolve(path, limits=Limits(max_bytes=1 << 30, max_seconds=ARCHIVE_SECONDS))
    except UsageError as error:
        return refusal(error)
    return "accepted"


def read_reproducer(path: str, folder: str) -> str:
    """What ``edgefuse fuzz --replay PATH`` does before its checks: read and check the SPEC (refused on
    exit 2), then build the module rendered from it and run it once ("not-run" when torch cannot)."""
    from edgefuse.fuzz.render import build
    from edgefuse.fuzz.reproducer import read_specs

    try:
        specs = read_specs(Path(path))
    except (OSError, ValueError) as error:
        return refusal(error)
    try:
        built = build(specs)
        import torch

        with torch.no_grad():
            built.module(*built.inputs)
    except Exception:  # noqa: BLE001  (run_unit records the case as unexportable; the replay exits 2)
        return "not-run"
    return "accepted"


class _Archives:
    """The archive reader's files: saved programs to mutate, and :func:`hostile_programs`, fed now and then
    as they are, built the first time one is drawn (each is an export)."""

    def __init__(self) -> None:
        self.hostile: list[bytes] = []

    def bases(self, targets: Targets) -> list[bytes]:
        self.hostile = []
        return list(saved_programs().values())

    def mutate(self, rng: random.Random, base: bytes, targets: Targets) -> bytes:
        draw = rng.random()
        if draw < 0.03:
            self.hostile = self.hostile or hostile_programs(targets)
            return rng.choice(self.hostile)
        if draw < 0.18:
            return zipped(_hostile_edit(rng, records(base), targets))
        return mutate_archive(rng, base, targets.marker)


def _reproducer_bases(targets: Targets) -> list[bytes]:
    return [text.encode() for text in reproducer_texts(0)]


def _mutate_reproducer(rng: random.Random, base: bytes, targets: Targets) -> bytes:
    return mutate_reproducer(rng, base.decode(), targets.marker).encode("utf-8", "replace")


def readers() -> dict[str, Reader]:
    """The four readers of files other people send, by the option that sets their count."""
    from edgefuse.fuzz import trust_configs, trust_ptes

    archives = _Archives()
    return {
        "archives": Reader("archives", ".pt2", archives.bases, archives.mutate, read_archive, 60.0),
        "reproducers": Reader("reproducers", ".py", _reproducer_bases, _mutate_reproducer, read_reproducer, 60.0),
        "configs": Reader("configs", ".yaml", trust_configs.bases, trust_configs.mutate, trust_configs.read, 60.0),
        "ptes": Reader("ptes", ".pte", trust_ptes.bases, trust_ptes.mutate, trust_ptes.read, 60.0),
    }


def snapshot(folder: str) -> dict[str, tuple]:
    """Every entry under ``folder`` (symlinks not followed): its type, size, time and bytes' digest."""
    import hashlib
    import stat

    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            digest = ""
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            elif stat.S_ISLNK(info.st_mode):
                digest = os.readlink(path)
            out[os.path.relpath(path, folder)] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns, digest)
    return out


#: The decoy's bytes: what a write through a hostile file would change.
DECOY = b"the user's own file: a write outside the output folder changes it\n"
#: How far past this process's address space a reading child may reach: a file that asks for more fails
#: there, not on the machine.
CHILD_MEMORY = 4 << 30


def _in_child(outside: str) -> None:
    """The reading child's surroundings: its working folder the outside one, its standard output
    dropped (hydra and the runtime write there), its address space bounded."""
    import resource

    os.chdir(outside)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + CHILD_MEMORY, size + CHILD_MEMORY))


def feed(counts: Counts, reader: Reader, path: str, folder: str, targets: Targets, label: str) -> None:
    """Read ``path`` with ``reader`` in a child forked for it, killed at the reader's deadline, and count
    what became of it: its outcome, an escape, a hang, the marker, a change outside."""
    from edgefuse.runtime.contained import Crashed, TimedOut, contained

    before = snapshot(targets.outside)
    counts.files += 1

    def step(note):
        _in_child(targets.outside)
        note(f"reading {path}")
        return reader.read(path, folder)

    try:
        outcome = contained(step, until=time.monotonic() + reader.seconds)
    except TimedOut:
        counts.hangs.append(label)
        outcome = None
    except Crashed as error:
        counts.escapes.append(f"{label}: {error}")
        outcome = None
    except RuntimeError as error:  # the read raised: the child's traceback
        counts.escapes.append(f"{label}: {error}")
        outcome = None
    if outcome == "refused":
        counts.refused += 1
    elif outcome in ("accepted", "not-run"):
        counts.accepted += 1
        counts.not_run += outcome == "not-run"
    elif outcome is not None:
        counts.escapes.append(f"{label}: {outcome}")
    if os.path.exists(targets.marker):
        counts.code_run.append(label)
        os.remove(targets.marker)
    after = snapshot(targets.outside)
    if after != before:
        changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
        counts.writes_outside.append(f"{label}: {', '.join(changed)}")
        _restore(targets)


def _restore(targets: Targets) -> None:
    """The outside folder as a run starts: the decoy alone."""
    shutil.rmtree(targets.outside, ignore_errors=True)
    os.makedirs(targets.outside, mode=0o700)
    with open(targets.decoy, "wb") as f:
        f.write(DECOY)


def measure(counts: dict[str, int], seed: int = 0, log=sys.stderr, chosen: dict[str, Reader] | None = None) -> dict[str, Counts]:
    """Feed ``counts[name]`` mutated files to each reader of :func:`readers` (or of ``chosen``) by name."""
    from edgefuse.runtime.files import fresh_private_folder
    from edgefuse.runtime.quiet import quiet_torch_logs

    every = chosen if chosen is not None else readers()
    results = {name: Counts() for name in counts}
    top = fresh_private_folder("edgefuse-trust-")
    folder, outside = os.path.join(top, "out"), os.path.join(top, "outside")
    os.makedirs(folder, mode=0o700)
    targets = Targets(os.path.join(folder, "MARKER"), outside, os.path.join(outside, "decoy.txt"))
    _restore(targets)
    try:
        with quiet_torch_logs():
            for name, n in counts.items():
                if not n:
                    continue
                reader, result = every[name], results[name]
                rng = random.Random(f"edgefuse-trust:{name}:{seed}")
                start = time.monotonic()
                bases = reader.bases(targets)
                for i in range(n):
                    k = rng.randrange(len(bases))
                    path = os.path.join(folder, f"mutant-{i}{reader.suffix}")
                    with open(path, "wb") as f:
                        f.write(reader.mutate(rng, bases[k], targets))
                    feed(result, reader, path, folder, targets, f"{name} {i} (from base {k})")
                    os.remove(path)
                    if log and (i + 1) % 100 == 0:
                        print(f"  {name}: {i + 1}/{n}, {time.monotonic() - start:.0f} s", file=log, flush=True)
                result.seconds = time.monotonic() - start
    finally:
        shutil.rmtree(top, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m edgefuse.fuzz.trust``: 0 when no file escaped, hung, ran code or wrote outside, else 1."""
    parser = argparse.ArgumentParser(
        prog="python -m edgefuse.fuzz.trust",
        description="Feed mutated files (bytes, structure, hostile edits) to edgefuse's four readers of files "
        "other people send: .pt2 archives, reproducers, export-llm configs, .pte programs for bench-llm. Each "
        "file is read in a child killed at a deadline; count files accepted and refused, escapes (a traceback "
        "or a crash), hangs, payloads that ran and writes outside the output folder.",
    )
    for name, what in (("archives", ".pt2 archives"), ("reproducers", "reproducers"),
                       ("configs", "export-llm configs"), ("ptes", ".pte programs for bench-llm")):
        parser.add_argument(f"--{name}", type=int, default=1000, metavar="N", help=f"mutated {what} (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="mutation seed (default 0)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    counts = {name: getattr(args, name) for name in ("archives", "reproducers", "configs", "ptes")}
    if min(counts.values()) < 0:
        print("--archives, --reproducers, --configs and --ptes take non-negative numbers", file=sys.stderr)
        return 2
    start = time.monotonic()
    results = measure(counts, args.seed, log=None if args.quiet else sys.stderr)
    print(f"edgefuse fuzz trust: seed {args.seed}, {time.monotonic() - start:.1f} s in all")
    for name, result in results.items():
        print(result.line(name))
    for name, result in results.items():
        for what, labels in (("escaped", result.escapes), ("hung", result.hangs), ("ran code", result.code_run),
                             ("wrote outside", result.writes_outside)):
            for label in labels[:3]:
                print(f"{what}: {label}")
    bad = sum(result.bad for result in results.values())
    print("result: " + ("FAIL" if bad else "OK"))
    return 1 if bad else 0


if __name__ == "__main__":
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()
    sys.exit(main())
