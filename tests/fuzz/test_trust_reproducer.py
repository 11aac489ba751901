"""A reproducer is data for ``--replay``: text injected into any string field of its SPEC is refused with
exit 2 and the field named, before anything is rendered or run; the renderer pastes no text of a spec's
own whatever it is given; every reproducer a seeded fuzz run writes still replays unchanged."""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys

import pytest

import edgefuse
from edgefuse.fuzz import cli as fuzz_cli
from edgefuse.fuzz import trust
from edgefuse.fuzz.generate import generate
from edgefuse.fuzz.render import source
from edgefuse.fuzz.reproducer import MAX_BYTES, read_specs, reproducer_text
from edgefuse.fuzz.runner import Options, run
from edgefuse.fuzz.shrink import candidates
from edgefuse.fuzz.spec import CastSpec, Tail, WeightSpec, to_dict
from edgefuse.fuzz.validate import SpecError, cases

SEED = 4


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return trust.reproducer_texts(SEED)


def _string_fields(texts: list[str]) -> dict[str, tuple[int, tuple]]:
    """One (text, path) for each string field the fuzzer writes, by its field name (``norm.weight.kind``)."""
    fields: dict[str, tuple[int, tuple]] = {}
    for k, text in enumerate(texts):
        literal, _ = trust.spec_literal(text)
        for path in trust.string_fields(literal):
            name = ".".join(str(p) if isinstance(p, str) else "[]" for p in path[1:])
            fields.setdefault(name, (k, path))
    return fields


def _field(path: tuple) -> str:
    """The field name a refusal gives for ``path`` (``SPEC[0].norm.pre[0].kind``)."""
    out = f"SPEC[{path[0]}]"
    for p in path[1:]:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def test_the_generated_reproducers_have_string_fields_everywhere_the_generator_writes_them(texts):
    names = set(_string_fields(texts))
    for name in ("heads_view", "dtype", "near_miss", "norm.form", "norm.square", "norm.inverse", "norm.eps_how",
                 "norm.dims_style", "norm.scaled", "norm.rounded_via", "norm.eps_dtype", "norm.weight.kind",
                 "norm.weight.shape", "norm.weight.dtype", "norm.pre.[].kind", "norm.pre.[].dtype", "tails.[].kind",
                 "tails.[].dtype", "__type__"):
        assert name in names, sorted(names)


@pytest.mark.parametrize("injection", range(len(trust.INJECTIONS)))
def test_text_injected_into_any_string_field_is_refused_with_the_field_named(injection, texts, tmp_path, capsys):
    marker = str(tmp_path / "MARKER")
    for name, (k, path) in sorted(_string_fields(texts).items()):
        file = tmp_path / "repro.py"
        file.write_text(trust.injected(texts[k], path, trust.INJECTIONS[injection], marker))
        assert fuzz_cli.main(["--replay", str(file)]) == 2, name
        err = capsys.readouterr().err
        assert not os.path.exists(marker), name
        assert "its SPEC is not a list of cases the fuzzer wrote" in err, err
        assert _field(path) in err, (name, err)
        assert "Traceback" not in err


def test_the_same_injection_in_a_spec_built_in_python_is_refused_by_the_renderer(tmp_path):
    # The renderer pastes no text of a spec's own: given a spec no file check saw, it still raises.
    marker = str(tmp_path / "MARKER")
    code = trust.code_that_touches(marker)
    spec = generate(SEED, 0)
    norm = dataclasses.replace(spec.norm, weight=spec.norm.weight or WeightSpec("float32"),
                               pre=(CastSpec("to", "float32"),))
    spec = dataclasses.replace(spec, norm=norm, tails=(Tail("mul-tensor"),), heads=1)
    text = f"view(1)\n{code}\n#"
    hostile = [
        dataclasses.replace(spec, heads=2, shape=(*spec.shape[:-1], 16), heads_view=text),
        dataclasses.replace(spec, dtype=text),
        dataclasses.replace(spec, near_miss=text),
        dataclasses.replace(spec, norm=dataclasses.replace(norm, form=text)),
        dataclasses.replace(spec, norm=dataclasses.replace(norm, square=text)),
        dataclasses.replace(spec, norm=dataclasses.replace(norm, inverse=text)),
        dataclasses.replace(spec, norm=dataclasses.replace(norm, eps=text)),
        dataclasses.replace(spec, norm=dataclasses.replace(norm, pre=(CastSpec("to", text),))),
        dataclasses.replace(spec, norm=dataclasses.replace(norm, pre=(CastSpec("method", text),))),
        dataclasses.replace(spec, norm=dataclasses.replace(norm, weight=dataclasses.replace(norm.weight, seed=text))),
        dataclasses.replace(spec, norm=dataclasses.replace(norm, weight=dataclasses.replace(norm.weight, dtype=text))),
        dataclasses.replace(spec, tails=(Tail("mul-tensor", dtype=text),)),
        dataclasses.replace(spec, tails=(Tail("mul-scalar", value=text),)),
        dataclasses.replace(spec, shape=(*spec.shape[:-1], text)),
        dataclasses.replace(spec, input_seed=text),
        dataclasses.replace(spec, seed=text),
    ]
    for bad in hostile:
        with pytest.raises((ValueError, TypeError)):
            source([bad])
    assert not os.path.exists(marker)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("shape", (2, 10 ** 6), "SPEC[0].shape[1]: 1000000 is outside 1..64"),
    ("shape", (2,), "SPEC[0].shape: holds 1 items"),
    ("heads", 3, "SPEC[0].heads: 3 heads do not split"),
    ("scale", 1e300, "SPEC[0].scale: 1e+300 is not one of"),
    ("input_seed", -1, "SPEC[0].input_seed: -1 is outside"),
    ("residual", 1, "SPEC[0].residual: 1 is not True or False"),
    ("tails", ({"__type__": "Tail", "kind": "residual"},) * 9, "SPEC[0].tails: holds 9 items"),
    ("norm", {"__type__": "CastSpec", "kind": "to", "dtype": "float32"}, "SPEC[0].norm.__type__: 'CastSpec'"),
    ("bogus", 1, "SPEC[0].bogus: CaseSpec has no such field"),
])
def test_numbers_out_of_range_and_wrong_shapes_are_refused_with_the_field_named(field, value, message, tmp_path, capsys):
    literal = to_dict(generate(SEED, 1))
    literal = dict(literal, **{field: value})
    if field == "heads":
        literal["shape"] = (2, 16)
    file = tmp_path / "repro.py"
    file.write_text(f"SPEC = {[literal]!r}\n")
    assert fuzz_cli.main(["--replay", str(file)]) == 2
    assert message in capsys.readouterr().err


def test_every_case_the_generator_and_shrinker_write_passes_the_check_unchanged():
    # The check reads the generator's own sets: what it writes is valid, and comes back equal.
    for seed in (0, SEED):
        for index in range(400):
            spec = generate(seed, index)
            for case in (spec, *candidates(spec)):
                [back] = cases([to_dict(case)])
                assert repr(back) == repr(case)


def test_every_reproducer_a_seeded_fuzz_run_writes_replays_unchanged(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("injected: every case fails, so every case gets a reproducer")

    real = edgefuse.recompose_rms_norm
    monkeypatch.setattr(edgefuse, "recompose_rms_norm", broken)
    out = tmp_path / "found"
    summary = run(Options(seed=SEED, cases=6, batch=3, edge_every=1000, out=out, shrink=0, progress_seconds=1e9))
    monkeypatch.setattr(edgefuse, "recompose_rms_norm", real)
    files = sorted(out.glob("*.py"))
    assert summary.written and len(files) == len(set(summary.written))
    for file in files:
        specs = read_specs(file)
        for spec in specs:
            assert spec == generate(SEED, spec.index) or repr(spec) == repr(generate(SEED, spec.index))
        assert source(specs) in file.read_text()  # the file holds the source its SPEC renders to
    capsys.readouterr()
    assert fuzz_cli.main(["--replay", str(files[0])]) == 0  # and a replay runs every check on it
    assert "checks, rebuilt" in capsys.readouterr().out


def test_a_file_that_is_not_python_or_holds_no_spec_is_refused(tmp_path, capsys):
    for text, reason in (("SPEC = [\n", "it is not Python"), ("x = 1\n", "it holds no SPEC"),
                         ("SPEC = " + "[" * 200000 + "]" * 200000, "it is not Python"),
                         ("SPEC = [__import__('os')]\n", "its SPEC is not a literal")):
        file = tmp_path / "repro.py"
        file.write_text(text)
        assert fuzz_cli.main(["--replay", str(file)]) == 2
        assert reason in capsys.readouterr().err


def test_spec_errors_name_their_field():
    with pytest.raises(SpecError) as error:
        cases([dict(to_dict(generate(SEED, 2)), heads_view="view(1)")])
    assert error.value.field == "SPEC[0].heads_view" and "'view(1)' is not one of view, reshape" in str(error.value)


def _within_4_gib_of_memory():
    """A child's address space bound: a reader that never stops fails there, not on the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("kind", ["a FIFO", "a character device"])
@pytest.mark.slow
def test_a_fifo_or_a_device_as_reproducer_exits_2_at_once(kind, tmp_path):
    """``edgefuse fuzz --replay`` on a FIFO (opening it waits for a writer) or ``/dev/zero`` (it never
    ends): exit 2 naming what it is, before a byte is read; no hang, no memory run out."""
    path = "/dev/zero"
    if kind == "a FIFO":
        path = str(tmp_path / "repro.py")
        os.mkfifo(path)
    done = subprocess.run([sys.executable, "-m", "edgefuse", "fuzz", "--replay", path], capture_output=True, text=True,
                          timeout=180, preexec_fn=_within_4_gib_of_memory)
    assert done.returncode == 2, done.stderr
    assert f"cannot replay {path}: {path} is {kind}, not a regular file" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_reproducer_past_the_bound_is_refused_before_it_is_parsed(tmp_path, capsys):
    file = tmp_path / "repro.py"
    file.write_text("#" * MAX_BYTES + "\n")
    assert fuzz_cli.main(["--replay", str(file)]) == 2
    assert f"holds {MAX_BYTES + 1:,} bytes, past the bound of {MAX_BYTES:,}" in capsys.readouterr().err
