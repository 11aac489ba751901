"""A .pt2 is read without running code it carries: every way torch.export.load (torch 2.13) would run
code from an archive is refused with exit 2 and the entry named, before anything loads; archives that are
not what torch.export.save writes are refused too; real archives of every built-in model still load."""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import zipfile

import pytest
import torch

from edgefuse import cli
from edgefuse.inputs import pt2
from edgefuse.inputs.errors import USAGE
from edgefuse.fuzz import trust
from edgefuse.inputs.modelspec import resolve

#: The hostile archives whose payload torch.export.load itself runs (when the program is loaded and run):
#: the test below shows each is a real attack, so that refusing it is a real defence.
RUN_BY_TORCH = ("pickled-weight", "pickled-constant", "opaque-constant", "legacy-weights", "legacy-constants",
                "sample-inputs", "guards-code", "symbolic-size", "older-format")

#: The hostile archives whose code is an operator the program would call when run.
CALLED_WHEN_RUN = ("node-target", "operator-argument")


@pytest.fixture(scope="module")
def saved() -> dict[str, bytes]:
    return trust.saved_programs()


def _write(tmp_path, data: bytes, name: str = "model.pt2") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _report(path: str, capsys, *flags: str) -> tuple[int, str, str]:
    code = cli.main(["-q", "report", path, "--stage", "capture", *flags])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("base", ["constant-dynamic", "tiny-llama"])
@pytest.mark.parametrize("kind", list(trust.HOSTILE_ARCHIVES))
def test_a_hostile_archive_is_refused_before_its_code_runs(kind, base, saved, tmp_path, capsys):
    marker = str(tmp_path / "MARKER")
    path = _write(tmp_path, trust.hostile_archive(kind, saved[base], marker))
    code, out, err = _report(path, capsys)
    assert code == USAGE, err
    assert not os.path.exists(marker)
    assert out == ""  # nothing reported: the refusal comes before any work
    _, why = trust.HOSTILE_ARCHIVES[kind]
    phrase = ("running its program would call what edgefuse does not run" if kind in CALLED_WHEN_RUN
              else "torch.export.load would run code it carries")
    assert phrase in err and "--trust-pickled-pt2" in err
    assert trust.HOSTILE_ENTRIES[kind] in err and why in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", RUN_BY_TORCH)
def test_each_refused_archive_runs_its_payload_in_torch_itself(kind, saved, tmp_path):
    # Without edgefuse's check the same file runs the attacker's code: the refusals guard real paths.
    marker = str(tmp_path / "MARKER")
    data = trust.hostile_archive(kind, saved["constant-dynamic"], marker)
    logging.disable(logging.CRITICAL)  # torch logs the failed weights_only load with a traceback
    try:
        program = torch.export.load(io.BytesIO(data))
        program.module()(*program.example_inputs[0])
    except Exception:  # noqa: BLE001  (some payloads leave a program that does not run: the code already ran)
        pass
    finally:
        logging.disable(logging.NOTSET)
    assert os.path.exists(marker), kind


def test_the_trust_flag_loads_an_archive_that_runs_code(saved, tmp_path, capsys):
    # The weight is a pickle that runs code and then gives the tensor the program expects.
    marker = str(tmp_path / "MARKER")
    entries = trust.records(saved["constant-dynamic"])
    config_name = next(n for n in entries if n.endswith("_weights_config.json"))
    config = json.loads(entries[config_name])
    meta = config["config"]["weight"]
    meta["use_pickle"] = True
    entries[config_name] = json.dumps(config).encode()
    entries[next(n for n in entries if n.endswith("data/weights/" + meta["path_name"]))] = trust.torch_saved(
        trust.Payload(marker, then="__import__('torch').nn.Parameter(__import__('torch').ones(8))"))
    path = _write(tmp_path, trust.zipped(entries))
    assert _report(path, capsys)[0] == USAGE and not os.path.exists(marker)
    assert cli.build_parser().parse_args(["report", path, "--trust-pickled-pt2"]).trust_pickled_pt2
    spec = resolve(path, trust_pt2=True)  # what --trust-pickled-pt2 passes
    assert os.path.exists(marker) and spec.kind == "program"
    torch.testing.assert_close(spec.program.state_dict["weight"], torch.ones(8))


def _entries(data: bytes) -> dict[str, bytes]:
    return trust.records(data)


def _edited(data: bytes, suffix: str, edit) -> bytes:
    entries = _entries(data)
    name = next(n for n in entries if n.endswith(suffix))
    value = json.loads(entries[name])
    edit(value)
    entries[name] = json.dumps(value).encode()
    return trust.zipped(entries)


def _first_weight(config: dict) -> dict:
    return next(iter(config["config"].values()))


def _malformed(base: bytes) -> dict[str, tuple[bytes, str]]:
    entries = _entries(base)
    root = next(iter(entries)).split("/")[0]
    stray = dict(entries, **{"elsewhere/models/model.json": b"{}"})
    compressed = io.BytesIO()
    with zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    duplicate = io.BytesIO()
    with zipfile.ZipFile(duplicate, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        archive.writestr(f"{root}/models/model.json", b"{}")
    return {
        "not a zip": (b"print('a .pt2 that is a Python file')\n", "not a zip archive"),
        "truncated": (base[: len(base) // 2], "not a zip archive"),
        "malformed weights config": (
            trust.zipped({n: (b"{not json" if n.endswith("_weights_config.json") else d) for n, d in entries.items()}),
            "_weights_config.json is not valid JSON",
        ),
        "malformed program": (
            trust.zipped({n: (b"[1, 2" if n.endswith("models/model.json") else d) for n, d in entries.items()}),
            "models/model.json is not valid JSON",
        ),
        "sizes past the stored bytes": (
            _edited(base, "_weights_config.json",
                    lambda c: _first_weight(c)["tensor_meta"]["sizes"].__setitem__(0, {"as_int": 1 << 40})),
            "are stored",
        ),
        "strides past the stored bytes": (
            _edited(base, "_weights_config.json",
                    lambda c: _first_weight(c)["tensor_meta"]["storage_offset"].__setitem__("as_int", 99)),
            "are stored",
        ),
        "a payload that is not there": (
            _edited(base, "_weights_config.json", lambda c: _first_weight(c).__setitem__("path_name", "weight_99")),
            "is missing",
        ),
        "a payload name with a path": (
            _edited(base, "_weights_config.json",
                    lambda c: _first_weight(c).__setitem__("path_name", "../../models/model.json")),
            "is not the name of a file",
        ),
        "an entry outside the archive's folder": (trust.zipped(stray), "lies outside the archive's folder"),
        "an entry twice": (duplicate.getvalue(), "appears twice"),
        "compressed entries": (compressed.getvalue(), "is compressed"),
        "no program": (trust.zipped({n: d for n, d in entries.items() if "/models/" not in n}), "holds no program"),
    }


@pytest.mark.parametrize("case", ["not a zip", "truncated", "malformed weights config", "malformed program",
                                  "sizes past the stored bytes", "strides past the stored bytes",
                                  "a payload that is not there", "a payload name with a path",
                                  "an entry outside the archive's folder", "an entry twice", "compressed entries",
                                  "no program"])
def test_an_archive_torch_export_save_does_not_write_is_refused_with_the_reason(case, saved, tmp_path, capsys):
    data, reason = _malformed(saved["constant-dynamic"])[case]
    code, out, err = _report(_write(tmp_path, data), capsys)
    assert code == USAGE and out == ""
    assert "is not a program saved with torch.export.save" in err and reason in err, err
    assert "Traceback" not in err


def test_a_program_with_dynamic_sizes_and_guards_still_loads(tmp_path):
    # Derived dims and a slice by a size: symbolic sizes (sympy's srepr) and a line of guards_code.
    class Model(torch.nn.Module):
        def forward(self, x, y):
            z = torch.cat([x, y], 0)
            return z[: z.shape[0] // 2].reshape(-1, 2).sum() + z.mean()

    b, c = torch.export.Dim("b", min=2, max=64), torch.export.Dim("c", min=2, max=64)
    inputs = (torch.randn(4, 4), torch.randn(6, 4))
    program = torch.export.export(Model(), inputs, dynamic_shapes=({0: 2 * b}, {0: c}))
    assert program._guards_code  # what the check must accept
    path = str(tmp_path / "dynamic.pt2")
    torch.export.save(program, path)
    torch.testing.assert_close(resolve(path).eager(), program.module()(*inputs), rtol=0, atol=0)


#: The built-in models whose saved programs the fast tier loads: between them they call all 73 operators the
#: 13 built-in models call (Phi-3's chunk, Gemma2's tanh, T5's relative positions, Mamba2's conv1d, einsum
#: and softplus), and Phi-3 alone reaches every line of the archive check that any of them reaches; the
#: others load in the slow tier.
FAST_MODELS = ("tiny-phi3", "tiny-gemma2", "tiny-t5", "tiny-mamba2")


@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in FAST_MODELS else pytest.mark.slow)
                                  for name in __import__("edgefuse.inputs.models", fromlist=["MODEL_NAMES"]).MODEL_NAMES])
def test_every_built_in_model_saved_with_torch_export_save_still_loads(name, tmp_path, tiny_program):
    _, inputs, program = tiny_program(name)
    path = str(tmp_path / f"{name}.pt2")
    torch.export.save(program, path)
    spec = resolve(path)
    assert spec.kind == "program"
    assert set(spec.program.state_dict) == set(program.state_dict)
    with torch.no_grad():
        expected = program.module()(*inputs)
    torch.testing.assert_close(spec.eager(), expected, rtol=0, atol=0)  # the same program, bit for bit


def test_an_archive_two_zip_readers_read_differently_runs_no_code(saved, tmp_path, capsys):
    # zipfile reads a clean archive from the file, torch's reader the hostile one beside it.
    marker = str(tmp_path / "MARKER")
    data = trust.confused_archive(saved["constant-dynamic"], marker)
    with pytest.raises(pt2.ArchiveError, match="torch's zip reader and Python's would read two different archives"):
        pt2.check(data)
    code, out, err = _report(_write(tmp_path, data, "confused.pt2"), capsys)
    assert code == USAGE and out == "" and not os.path.exists(marker)
    assert "the directory lies at byte" in err and "two different archives" in err and "Traceback" not in err


def test_an_archive_torch_reads_otherwise_than_zipfile_is_refused_by_comparing_every_entry(saved, tmp_path,
                                                                                          monkeypatch):
    # The second defence alone: every entry read by torch's own reader must be the bytes that were checked.
    monkeypatch.setattr(pt2, "_one_directory", lambda data, infos, refuse: len(data))
    data = trust.confused_archive(saved["constant-dynamic"], str(tmp_path / "MARKER"))
    with pytest.raises(pt2.ArchiveError, match="holds other bytes for torch's zip reader than for Python's"):
        pt2.check(data)


def _end_record_edited(data: bytes, edit) -> bytes:
    end = bytearray(data[-22:])
    edit(end)
    return data[:-22] + bytes(end)


@pytest.mark.parametrize("case", ["prepended", "comment", "count", "offset", "local name"])
def test_a_zip_whose_structure_torch_export_save_does_not_write_is_refused(case, saved):
    base = saved["constant-dynamic"]
    clean = trust.zipped(trust.records(base))
    if case == "prepended":
        data, reason = b"#!/bin/sh\n" + clean, "torch's zip reader and Python's would read two different archives"
    elif case == "comment":
        data = _end_record_edited(clean, lambda e: e.__setitem__(slice(20, 22), b"\x04\x00")) + b"note"
        reason = "end record is not the file's last bytes"
    elif case == "count":
        data = _end_record_edited(clean, lambda e: e.__setitem__(slice(8, 12), struct.pack("<HH", 3, 3)))
        reason = "its end record counts 3 entries"
    elif case == "offset":
        data = _end_record_edited(clean, lambda e: e.__setitem__(slice(16, 20), struct.pack(
            "<I", struct.unpack("<I", e[16:20])[0] - 46)))
        reason = "two different archives"
    else:  # a payload's local header names another file than the central directory does
        name = b"archive/data/weights/weight_0"
        at = clean.index(name)  # the first time the name appears: in its local header
        data = clean[:at] + b"archive/data/weights/weightX0" + clean[at + len(name):]
        reason = "differ"
    with pytest.raises(pt2.ArchiveError, match=reason):
        pt2.check(data)


def test_a_file_torch_cannot_deserialize_is_refused_naming_what_failed(saved, tmp_path, capsys):
    data = _edited(saved["constant-dynamic"], "models/model.json",
                   lambda p: p["graph_module"]["graph"]["nodes"][0].__setitem__("target", "torch.ops.aten.nope.default"))
    code, out, err = _report(_write(tmp_path, data), capsys)
    assert code == USAGE and "We ran into an error" not in err
    assert "nope" in err, err


def _symbolic(program: dict, expression: str) -> None:
    meta = next(iter(program["graph_module"]["graph"]["tensor_values"].values()))
    meta["sizes"][0] = {"as_expr": {"expr_str": expression, "hint": {"as_int": 2}}}


@pytest.mark.parametrize("case", ["range-constraint", "range-constraint-underscores", "size-power", "size-pow-call", "size-power-of-power",
                                  "size-integer", "guard-power", "guard-string-times"])
def test_a_file_that_would_never_finish_loading_is_refused_by_the_check(case, saved):
    # Each would hang torch.export.load or the guards; the check refuses it without loading anything.
    edit, reason = {
        "range-constraint": (lambda p: p["range_constraints"].__setitem__("u1000000000000", {"min_val": 0,
                                                                                              "max_val": 4}),
                             "range_constraints names 'u1000000000000'"),
        "range-constraint-underscores": (
            lambda p: p["range_constraints"].__setitem__("zuf1_000_000_000", {"min_val": 0, "max_val": 4}),
            "range_constraints names 'zuf1_000_000_000'"),
        "size-power": (lambda p: _symbolic(p, "9**9**9**9"), "is not a plain sympy expression"),
        "size-pow-call": (lambda p: _symbolic(p, "Pow(Integer(9), Integer(999999999))"), "not a plain sympy"),
        "size-power-of-power": (lambda p: _symbolic(p, "Pow(Pow(Integer(9), Integer(64)), Integer(64))"),
                                "not a plain sympy"),
        "size-integer": (lambda p: _symbolic(p, "Integer(" + "9" * 40 + ")"), "not a plain sympy"),
        "guard-power": (lambda p: p.__setitem__("guards_code", ["L['x'].size()[0] == 9**9**9**9"]), "guards_code"),
        "guard-string-times": (lambda p: p.__setitem__("guards_code", ["'x' * 10**12 == 'x'"]), "guards_code"),
    }[case]
    data = _edited(saved["constant-dynamic"], "models/model.json", edit)
    try:
        entries = pt2.check(data)
    except pt2.ArchiveError as error:
        assert reason in str(error)
    else:
        assert any(reason in str(entry) for entry in entries), entries


@pytest.mark.parametrize("expression", ["Pow(Symbol('s77', positive=True, integer=True), Integer(2))",
                                        "Mul(Symbol('s0', integer=True), Pow(Symbol('s1', integer=True), Integer(-1)))",
                                        "Pow(Symbol('s0', integer=True), Rational(1, 2))", "Symbol('s0', integer=True)**2 + 1",
                                        "PowByNatural(Symbol('s0', integer=True), Integer(3))"])
def test_small_powers_as_torch_writes_them_are_still_accepted(expression, saved):
    data = _edited(saved["constant-dynamic"], "models/model.json", lambda p: _symbolic(p, expression))
    assert pt2.check(data) == []
