"""The trust measure (``python -m edgefuse.fuzz.trust``): a seeded subset of mutants per reader ends accepted
or refused with a reason, none escapes, hangs, runs code or writes outside; and each of those outcomes is
seen when a reader does it. The full run (1,000 files per reader) is the command, in docs/trust-fuzzing.md."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from edgefuse.fuzz import trust, trust_configs, trust_ptes

#: Files per reader here: enough for each to accept and refuse (seeded), small enough for a CI run.
SUBSET = {"archives": 12, "reproducers": 12, "configs": 12, "ptes": 12}


@pytest.mark.slow  # a seeded fuzz run of each reader, each file read in a child process
@pytest.mark.parametrize("name", list(SUBSET))
def test_a_seeded_subset_of_each_reader_is_accepted_or_refused_and_nothing_else(name):
    result = trust.measure({name: SUBSET[name]}, seed=1, log=None)[name]
    assert (result.escapes, result.hangs, result.code_run, result.writes_outside) == ([], [], [], [])
    assert result.files == SUBSET[name] == result.accepted + result.refused and result.refused > 0


def _read_bases(name: str, tmp_path) -> tuple[list[str], trust.Counts, list[str]]:
    """Each file reader ``name`` starts from, unchanged, fed as the measure feeds a mutant: the paths,
    the counts, and the paths refused."""
    targets = _targets(tmp_path)
    reader = trust.readers()[name]
    result, paths, refused = trust.Counts(), [], []
    for k, base in enumerate(reader.bases(targets)):
        path = tmp_path / f"base-{k}{reader.suffix}"
        path.write_bytes(base)
        before = result.refused
        trust.feed(result, reader, str(path), str(tmp_path), targets, f"base {k}")
        paths.append(str(path))
        if result.refused > before:
            refused.append(str(path))
    return paths, result, refused


@pytest.mark.parametrize("name", ["archives", "reproducers", pytest.param("ptes", marks=pytest.mark.slow)])
def test_the_valid_files_each_reader_starts_from_are_accepted(name, tmp_path):
    paths, result, _ = _read_bases(name, tmp_path)
    assert result.accepted == result.files == len(paths) > 0 and result.bad == 0, result


def _stock_export_llm_reaches_export_llama(path: str, folder) -> bool:
    """Whether ExecuTorch's own export_llm command line, without edgefuse's check, gets as far as
    ``export_llama`` on the config ``path`` (hydra's record in ``folder``), in a child: hydra sets up the
    logging of the process it runs in."""
    import sys

    import executorch.extension.llm.export.export_llm as entry

    from edgefuse.runtime.contained import contained

    class Reached(BaseException):
        pass

    def export_llama(config):
        raise Reached

    def step(note) -> bool:
        entry.export_llama = export_llama
        sys.argv = [entry.__file__, "--config", path, f"hydra.run.dir={folder}"]
        try:
            entry.main()
        except Reached:
            return True
        except (Exception, SystemExit):
            return False
        return False

    return contained(step)


@pytest.mark.slow  # each config read in a child, each refused one run through export_llm's command line in another
def test_executorchs_own_configs_are_accepted_unless_export_llm_itself_rejects_them(tmp_path):
    # No false refusal: ExecuTorch 1.5.1 ships configs its own export_llm rejects as they are (a section
    # left empty, `metadata='...'` written for `metadata: '...'`, LoRA configs without their environment
    # variable); each of those may be refused, every other one is accepted.
    paths, result, refused = _read_bases("configs", tmp_path)
    assert result.bad == 0 and result.accepted > len(paths) // 2, result
    wrongly = [path for path in refused if _stock_export_llm_reaches_export_llama(path, tmp_path / "stock")]
    assert wrongly == []


# --- each bad outcome is seen --------------------------------------------------------------------------


def _reader(read, seconds: float = 20.0) -> trust.Reader:
    return trust.Reader("fake", ".txt", lambda targets: [b"x"], lambda rng, base, targets: base, read, seconds)


def _measure(read, seconds: float = 20.0) -> trust.Counts:
    return trust.measure({"fake": 1}, log=None, chosen={"fake": _reader(read, seconds)})["fake"]


def _raises(path, folder):
    raise KeyError("a bug in a reader")


def _refuses_without_a_reason(path, folder):
    return trust.refusal(ValueError(""))


def _crashes(path, folder):
    os.kill(os.getpid(), signal.SIGSEGV)


def _sleeps(path, folder):
    time.sleep(60)


def _allocates(path, folder):
    bytearray(trust.CHILD_MEMORY + (1 << 30))
    return "accepted"


@pytest.mark.parametrize("read", [_raises, _refuses_without_a_reason, _crashes, _allocates])
def test_an_exception_a_refusal_without_a_reason_a_crash_or_memory_past_the_bound_is_an_escape(read):
    result = _measure(read)
    assert len(result.escapes) == 1 and result.bad == 1 and result.accepted == result.refused == 0


def test_a_read_still_running_at_its_deadline_is_a_hang():
    result = _measure(_sleeps, seconds=1.0)
    assert result.hangs == ["fake 0 (from base 0)"] and result.bad == 1


def test_the_marker_is_code_run():
    def touches(path, folder):
        open(os.path.join(folder, "MARKER"), "w").close()
        return "refused"

    result = _measure(touches)
    assert result.code_run == ["fake 0 (from base 0)"] and result.refused == 1


@pytest.mark.parametrize("how", ["decoy", "working folder", "symlink"])
def test_a_change_outside_the_output_folder_is_a_write_outside(how):
    def writes(path, folder):
        if how == "decoy":
            with open(os.path.join(os.getcwd(), "decoy.txt"), "ab") as f:
                f.write(b"!")
        elif how == "working folder":
            open("left-behind", "w").close()
        else:
            os.symlink("/etc/passwd", "link")
        return "accepted"

    def writes_nothing(path, folder):
        open(os.path.join(folder, "allowed"), "w").close()
        return "accepted"

    assert len(_measure(writes).writes_outside) == 1
    assert _measure(writes_nothing).bad == 0


def test_the_command_exits_1_on_a_bad_outcome_and_prints_each_reader(monkeypatch, capsys):
    monkeypatch.setattr(trust, "readers", lambda: {name: _reader(lambda p, f: "refused") for name in SUBSET})
    assert trust.main(["--archives", "2", "--reproducers", "1", "--configs", "1", "--ptes", "1", "-q"]) == 0
    out = capsys.readouterr().out
    for name in SUBSET:
        assert f"{name:<12} files " in out and "escapes 0, hangs 0, code run 0, writes outside 0" in out
    assert "result: OK" in out
    monkeypatch.setattr(trust, "readers", lambda: {name: _reader(_raises) for name in SUBSET})
    assert trust.main(["--archives", "1", "--reproducers", "0", "--configs", "0", "--ptes", "0", "-q"]) == 1
    assert "escaped: archives 0" in capsys.readouterr().out


# --- the hostile edits are refused ---------------------------------------------------------------------


def _targets(tmp_path) -> trust.Targets:
    outside = tmp_path / "outside"
    targets = trust.Targets(str(tmp_path / "MARKER"), str(outside), str(outside / "decoy.txt"))
    trust._restore(targets)
    return targets


@pytest.mark.parametrize("k", range(len(trust_configs.HOSTILE)))
def test_each_hostile_config_setting_is_refused_and_changes_nothing(k, tmp_path):
    targets = _targets(tmp_path)
    base = trust_configs.bases(targets)[0]
    text = trust_configs.HOSTILE[k].format(code=trust.code_that_touches(targets.marker).replace('"', "'"),
                                           decoy=targets.decoy, outside=targets.outside)
    reader = trust.readers()["configs"]
    result = trust.Counts()
    for i, mutant in enumerate((text.encode() + b"\n" + base, base + b"\n" + text.encode())):
        path = tmp_path / f"config-{i}.yaml"
        path.write_bytes(mutant)
        trust.feed(result, reader, str(path), str(tmp_path), targets, f"hostile {k}, {i}")
    assert result.refused == 2 and result.bad == 0, result


@pytest.mark.slow  # lowers the tiny program it edits
def test_hostile_plans_and_delegate_ids_are_refused(tmp_path):
    targets = _targets(tmp_path)
    reader = trust.readers()["ptes"]
    base = trust_ptes.bases(targets)[1]
    hostile = [trust_ptes.hostile_program(base, delegate_id=name) for name in trust_ptes.DELEGATE_IDS]
    hostile += [trust_ptes.hostile_program(base, planned=size) for size in trust_ptes.PLANNED[:4]]
    result = trust.Counts()
    for i, program in enumerate(hostile):
        path = tmp_path / f"hostile-{i}.pte"
        path.write_bytes(program)
        trust.feed(result, reader, str(path), str(tmp_path), targets, f"hostile {i}")
    assert result.refused == len(hostile) and result.bad == 0, result


def test_a_config_hydra_reads_otherwise_than_the_check_is_an_escape(tmp_path, monkeypatch):
    # As if hydra were handed other bytes than those checked: the config export_llama gets is not the one
    # the checked settings make.
    import contextlib

    from edgefuse.llm import export

    targets = _targets(tmp_path)
    base = trust_configs.bases(targets)[0]
    other = tmp_path / "other.yaml"
    other.write_bytes(base + b"\nexport:\n  max_seq_length: 7\n" if b"export:" not in base else
                      base.replace(b"export:", b"export:\n  max_seq_length: 7", 1))
    monkeypatch.setattr(export, "_config_for_hydra", lambda config: contextlib.nullcontext(["--config", str(other)]))
    path = tmp_path / "config.yaml"
    path.write_bytes(base)
    result = trust.Counts()
    trust.feed(result, trust.readers()["configs"], str(path), str(tmp_path), targets, "config")
    assert len(result.escapes) == 1 and "another config than the checked settings make" in result.escapes[0]
