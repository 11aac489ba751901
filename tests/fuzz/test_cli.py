"""The fuzzer's command line: its exit codes, the reproducers it writes only on a finding, and usage errors
for numbers out of range and for specs it did not write."""

from __future__ import annotations

import pytest

import edgefuse
from edgefuse.fuzz import cli


def test_the_command_line_exits_zero_and_writes_nothing_when_nothing_fails(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--cases", "3", "--start", "1", "--seed", "11", "--edge-every", "1000", "--progress", "0", "-q"]) == 0
    out, err = capsys.readouterr()
    assert "edgefuse fuzz:" not in err and "cases/s" not in err, err  # -q: no header, no progress
    assert "generated            3 cases" in out and "mismatches           0" in out
    assert list(tmp_path.iterdir()) == []  # the reproducer directory is created only when a case fails


def test_the_command_line_exits_one_on_a_finding_and_writes_reproducers(capsys, monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(edgefuse, "recompose_rms_norm", broken)
    argv = ["--cases", "1", "--start", "1", "--seed", "11", "--edge-every", "1000", "--shrink", "0"]
    assert cli.main(argv) == 1
    assert "exceptions           3" in capsys.readouterr().out
    assert len(list((tmp_path / "edgefuse-fuzz-failures").glob("exception-*.py"))) == 3


@pytest.mark.parametrize("argv", [["--cases", "0"], ["--jobs", "0"], ["--start", "-5"], ["--hostile-every", "-1"]])
def test_numbers_out_of_range_are_usage_errors(argv, capsys):
    assert cli.main(argv) == 2
    assert "non-negative ones" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ['{"foo": 1}', "[1, 2]", "[]", '{"__type__": "Nope"}', '{"__type__": "CaseSpec", "bogus": 1}'])
def test_replaying_a_spec_the_fuzzer_did_not_write_is_a_usage_error(spec, capsys, tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(f"SPEC = {spec}\n")
    assert cli.main(["--replay", str(path)]) == 2
    assert "its SPEC is not a list of cases the fuzzer wrote" in capsys.readouterr().err


def test_replaying_a_case_with_values_the_fuzzer_never_writes_is_a_usage_error(capsys, tmp_path):
    from dataclasses import replace

    from edgefuse.fuzz.spec import CaseSpec, NormSpec, to_dict

    case = CaseSpec(seed=0, index=0, shape=(2, 16), dtype="float32", norm=NormSpec("llama"))
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(f"SPEC = {[to_dict(case)]!r}\n")
    bad.write_text(f"SPEC = {[to_dict(replace(case, dtype='float99'))]!r}\n")
    assert cli.main(["--replay", str(good)]) == 0
    assert cli.main(["--replay", str(bad)]) == 2
    assert "SPEC[0].dtype: 'float99' is not one of float32" in capsys.readouterr().err

