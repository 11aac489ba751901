"""An ``export-llm`` config and its overrides are data: whatever would make hydra run code, write a file or
load another config exits 2 naming the key, within 10 s, before hydra reads anything, with no file
changed; hydra's run folder and job log go beside the ``.pte`` (or in ``--hydra-dir``) and nowhere else;
every config ExecuTorch ships passes the check."""

from __future__ import annotations

import glob
import hashlib
import os
import time

import pytest

from edgefuse import cli
from edgefuse.inputs.errors import USAGE
from edgefuse.fuzz.refusal_times import largest_config
from edgefuse.llm import config_check
from edgefuse.llm.config_check import ConfigRefused, check_overrides, read_config, run_folder_override

#: A callback hydra instantiates: ``distutils.spawn.spawn`` runs a shell command, and is not on hydra's
#: list of targets it refuses. ``<marker>`` is the file the command makes.
CALLBACK = """\
hydra:
  callbacks:
    spawn:
      _target_: distutils.spawn.spawn
      cmd: [sh, -c, "touch <marker>"]
"""

#: hydra's job log pointed at another file, opened for writing (``mode: w`` truncates it).
LOG_HANDLER = """\
hydra:
  job_logging:
    handlers:
      file:
        filename: <victim>
        mode: w
"""

#: hydra's run folder (its record and job log) moved elsewhere.
RUN_FOLDER = """\
hydra:
  run:
    dir: <elsewhere>
"""

#: What every test config sets besides: a checkpoint that does not exist, so that an export hydra did
#: start fails soon after hydra has done what the config asked.
FAILS_SOON = "base:\n  checkpoint: <missing>\n"


def snapshot(root) -> dict[str, str]:
    """Every file and folder under ``root`` with a hash of its bytes: what a run may not change."""
    found = {}
    for folder, folders, files in os.walk(root):
        for name in folders:
            found[os.path.join(folder, name)] = "folder"
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.isfile(path):  # a FIFO a test made: opening it would wait for a writer
                found[path] = "not a file"
                continue
            with open(path, "rb") as f:
                found[path] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A working folder (the cwd), a folder for the config, an output folder, a file a config might aim at,
    and the marker a command would make: all under ``tmp_path``."""
    work, configs, out = tmp_path / "work", tmp_path / "configs", tmp_path / "out"
    for folder in (work, configs, out):
        folder.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    monkeypatch.chdir(work)
    return {"root": tmp_path, "work": work, "configs": configs, "out": out, "victim": victim,
            "marker": tmp_path / "MARKER", "elsewhere": tmp_path / "elsewhere",
            "missing": tmp_path / "missing.pth"}


def placed(place, text: str) -> str:
    """``text`` with each ``<name>`` of ``place`` replaced by its path."""
    for name, path in place.items():
        text = text.replace(f"<{name}>", str(path))
    return text


def write_config(place, text: str, name: str = "config.yaml") -> str:
    path = place["configs"] / name
    path.write_text(placed(place, text))
    return str(path)


@pytest.fixture(scope="module", autouse=True)
def imported():
    """ExecuTorch's LlmConfig and hydra imported once, so that no test's refusal pays for the import."""
    config_check._llm_config()
    check_overrides(["base.checkpoint=x"])


def refused(place, capsys, *arguments: str) -> str:
    """Run ``export-llm ARGUMENTS`` in the working folder: exit 2, no traceback, no file under the test's
    folder changed, no marker; the message. (How long a refusal takes is measured by
    ``python -m edgefuse.fuzz.refusal_times``, not asserted here.)"""
    before = snapshot(place["root"])
    code = cli.main(["-q", "export-llm", *arguments, f"export.output_name={place['out'] / 'model.pte'}"])
    err = capsys.readouterr().err
    assert code == USAGE, err
    assert "Traceback" not in err and "refused: " in err, err
    assert snapshot(place["root"]) == before
    assert not place["marker"].exists()
    return err


# -- configs that ask hydra for more than data ------------------------------------------------------


@pytest.mark.parametrize("attack", ["callback", "log-handler", "run-folder", "defaults"])
def test_each_attack_does_its_harm_when_hydra_reads_the_config_unchecked(place, attack):
    """ExecuTorch's export_llm handed the config as it is, without the check: the command runs, the user's
    file is truncated, the run folder lands elsewhere, another file's callback runs. So refusing each is a
    real defence."""
    from edgefuse.llm.export import ConfigRejected, _run_entry

    text = {"callback": CALLBACK, "log-handler": LOG_HANDLER, "run-folder": RUN_FOLDER,
            "defaults": "defaults:\n  - _self_\n  - other\n"}[attack]
    write_config(place, CALLBACK, "other.yaml")
    with pytest.raises(ConfigRejected, match="missing.pth"):
        _run_entry(["--config", write_config(place, text + FAILS_SOON)], "stock", None)
    harm = {"callback": place["marker"].exists(), "defaults": place["marker"].exists(),
            "log-handler": place["victim"].read_text() != "the user's own file\n",
            "run-folder": place["elsewhere"].is_dir()}
    assert harm[attack]


@pytest.mark.parametrize("attack, keys", [(CALLBACK, "hydra.callbacks"), (LOG_HANDLER, "hydra.job_logging"),
                                          (RUN_FOLDER, "hydra.run")])
def test_a_config_with_hydra_settings_exits_2_naming_them_and_nothing_runs_or_changes(place, capsys, attack, keys):
    """A callback that would run a shell command, a job log aimed at the user's file, a run folder moved."""
    path = write_config(place, attack + FAILS_SOON)
    err = refused(place, capsys, "--config", path)
    assert f"{path}: {keys}: hydra's own settings are edgefuse's to make" in err
    assert place["victim"].read_text() == "the user's own file\n" and not place["elsewhere"].exists()


def test_a_log_handler_aimed_at_a_new_file_does_not_make_it(place, capsys):
    place["victim"].unlink()
    path = write_config(place, LOG_HANDLER + FAILS_SOON)
    assert "hydra.job_logging: hydra's own settings" in refused(place, capsys, "--config", path)
    assert not place["victim"].exists()


@pytest.mark.parametrize("text, key", [
    ("model:\n  _target_: builtins.print\n", "model._target_"),
    ("multimethod:\n  methods:\n    - method_name: forward\n      lora_config:\n        _target_: os.getcwd\n",
     "multimethod.methods[0].lora_config._target_"),
    # where the schema has a string: named as a _target_, not as a mapping out of place
    ("base:\n  model_class:\n    _target_: os.system\n", "base.model_class._target_"),
    ("quantization:\n  calibration_tasks:\n    - {_target_: os.getcwd}\n", "quantization.calibration_tasks[0]._target_"),
])
def test_a_target_anywhere_exits_2_naming_it(place, capsys, text, key):
    err = refused(place, capsys, "--config", write_config(place, text))
    assert f"{key}: hydra instantiates what a _target_ names" in err


def test_a_defaults_entry_that_pulls_another_file_exits_2_naming_it(place, capsys):
    write_config(place, CALLBACK, "other.yaml")
    path = write_config(place, "defaults:\n  - _self_\n  - other\n" + FAILS_SOON)
    err = refused(place, capsys, "--config", path)
    assert "defaults[1]: 'other': hydra would load that config into this one" in err


def test_a_defaults_list_of_the_file_itself_passes():
    assert config_check.check_config({"defaults": ["_self_"], "base": {"checkpoint": "x"}}) == {
        "base": {"checkpoint": "x"}}


def test_an_unknown_key_exits_2_naming_it_and_the_keys_there_are(place, capsys):
    err = refused(place, capsys, "--config", write_config(place, "base:\n  checkpointt: x.pth\n"))
    assert "base.checkpointt: not a setting of ExecuTorch's BaseConfig (base), which has: model_class, " in err


@pytest.mark.parametrize("value, resolver", [("${now:%Y}", "now"), ("x${oc.decode:'${oc.env:HOME}'}", "oc.decode"),
                                             ("${oc.env:HOME,${hydra:runtime.cwd}}", "hydra")])
def test_a_resolver_other_than_oc_env_exits_2_naming_the_key_and_the_resolver(place, capsys, value, resolver):
    """``oc.decode`` evaluates a string as a value (a resolver hidden in it would escape any check); hydra's
    resolvers read hydra's own state; nested inside an allowed one too."""
    err = refused(place, capsys, "--config", write_config(place, f'base:\n  checkpoint: "{value}"\n'))
    assert f"base.checkpoint: {value!r} calls the resolver {resolver!r}" in err


def test_node_interpolations_and_oc_env_pass_and_an_escaped_resolver_is_text():
    config_check.check_config({"export": {"max_seq_length": 64, "max_context_length": "${export.max_seq_length}"},
                               "base": {"checkpoint": "${oc.env:HOME}/c.pth", "params": r"\${now:%Y}"}})


def test_a_package_header_exits_2_naming_it(place, capsys):
    """hydra puts a file with ``# @package base`` under ``base``: the check reads keys where they are written."""
    err = refused(place, capsys, "--config", write_config(place, "# @package base\ncheckpoint: x.pth\n"))
    assert "the hydra header '# @package base'" in err


@pytest.mark.parametrize("key", ["export.so_library", "debug.profile_path"])
def test_a_setting_whose_file_executorch_runs_or_writes_exits_2_in_a_config_and_passes_as_an_override(
    place, capsys, key
):
    section, name = key.split(".")
    err = refused(place, capsys, "--config", write_config(place, f"{section}:\n  {name}: {place['victim']}\n"))
    assert f"{key}: {config_check.COMMAND_LINE_ONLY[key]}" in err
    check_overrides([f"{key}={place['victim']}"])


@pytest.mark.parametrize("text, message", [
    ("- base\n", "a list where a config is a mapping of LlmConfig's sections"),
    ("base:\n  metadata: {get_bos_id: 1}\n", "base.metadata: a mapping where LlmConfig has str"),
    ("model:\n  local_global_attention: [[1, {window: x}]]\n",
     "model.local_global_attention[0]: a list where LlmConfig has int"),
    ("base:\n  checkpoint: !!binary aGk=\n", "base.checkpoint: a bytes (a YAML tag)"),
    ("base:\n  checkpoint: a\n  checkpoint: b\n", "found duplicate key checkpoint"),
    ("x: &a [*a, *a]\n", "x: not a setting"),
])
def test_a_config_that_is_not_llm_configs_shape_exits_2_naming_where(place, capsys, text, message):
    assert message in refused(place, capsys, "--config", write_config(place, text))


@pytest.mark.parametrize("arguments, message", [
    (["--config", "<configs>/deep.yaml"], "deep.yaml: nested deeper than a YAML reader follows"),
    (["--config", "<configs>/interpolations.yaml"], "base.checkpoint: interpolations nested more than 32 deep"),
    (["base.checkpoint=" + "[" * 5000 + "]" * 5000], "nested more than 32 deep"),
    (["base.checkpoint=" + "${oc.env:" * 5000 + "a" + "}" * 5000], "nested more than 32 deep"),
    (["base.metadata=" + "x," * 40_000 + "x"], "longer than 32,768 characters"),
])
def test_a_config_or_override_nested_or_long_past_the_parsers_exits_2(place, capsys, arguments, message):
    """omegaconf's and hydra's parsers take seconds on these before they fail, and YAML's recursion ends."""
    write_config(place, "base: " + "[" * 15_000 + "]" * 15_000 + "\n", "deep.yaml")
    write_config(place, "base:\n  checkpoint: " + "${oc.env:" * 3000 + "a" + "}" * 3000 + "\n",
                 "interpolations.yaml")
    assert message in refused(place, capsys, *(placed(place, a) for a in arguments))


def test_a_config_of_the_largest_size_is_read_and_checked(place):
    """A file at the size bound, of the values omegaconf's parser is slowest on (long resolver arguments,
    each string distinct), passes the check: the bound refuses only what is past it. The time it takes is
    measured by ``python -m edgefuse.fuzz.refusal_times``."""
    path = write_config(place, largest_config())
    assert config_check.MAX_CONFIG_BYTES - 3100 < os.path.getsize(path) <= config_check.MAX_CONFIG_BYTES
    _, settings = read_config(path)
    assert len(settings["quantization"]["calibration_tasks"]) == config_check.MAX_CONFIG_BYTES // 3030


def test_yaml_aliases_that_multiply_exit_2_at_the_bound(place, capsys):
    """A method aliased 1,000 times, each with 1,000 target modules: a file of a few KB that holds a million
    values, which the walk stops counting at MAX_VALUES."""
    modules = ", ".join(["x"] * 1000)
    method = "&m {method_name: a, lora_config: {adapter_checkpoint: a, target_modules: [" + modules + "]}}"
    path = write_config(place, f"multimethod:\n  methods: [{method}{', *m' * 999}]\n")
    assert os.path.getsize(path) < 10_000
    assert f"more than {config_check.MAX_VALUES:,} values" in refused(place, capsys, "--config", path)


@pytest.mark.parametrize("make, message", [
    (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),
    (lambda p: open(p, "wb").write(b" " * (config_check.MAX_CONFIG_BYTES + 1)), "past the bound of 32,768"),
    (lambda p: open(p, "wb").write(b"base:\n  checkpoint: \xff\n"), "not UTF-8 text"),
    (lambda p: None, "no such file"),
])
def test_a_config_file_that_is_not_a_small_regular_text_file_exits_2(place, capsys, make, message):
    path = str(place["configs"] / "odd.yaml")
    make(path)
    assert message in refused(place, capsys, "--config", path)


# -- the same through overrides ---------------------------------------------------------------------


@pytest.mark.parametrize("override, message", [
    ("+hydra.callbacks.spawn._target_=distutils.spawn.spawn", "hydra.callbacks.spawn._target_: hydra's own settings"),
    ("hydra.job_logging.handlers.file.filename=<victim>", "hydra.job_logging.handlers.file.filename: hydra's own"),
    ("hydra.run.dir=<elsewhere>", "hydra.run.dir: hydra's own settings"),
    ("hydra/job_logging=disabled", "hydra/job_logging: hydra's own settings"),
    ("base/x=y", "base/x: selects a hydra config group or package"),
    ("base@model=1", "base: selects a hydra config group or package"),
    ("+base._target_=builtins.print", "base._target_: hydra instantiates what a _target_ names"),
    ("base={checkpoint: x, _target_: builtins.print}", "base._target_: hydra instantiates"),
    ("+base.checkpointt=x", "base.checkpointt: not a setting of ExecuTorch's BaseConfig"),
    ("++foo.bar=1", "foo: not a setting of ExecuTorch's LlmConfig"),
    ("~base.checkpoint", "base.checkpoint: deletes a setting (~)"),
    ("base.checkpoint=${now:%Y}", "base.checkpoint: '${now:%Y}' calls the resolver 'now'"),
    ("base.checkpoint=a,b", "base.checkpoint: a sweep of values"),
    ("base.checkpoint=choice(a,b)", "base.checkpoint: a sweep of values"),
    ("base.metadata=[1, {_target_: x}]", "base.metadata: a list where LlmConfig has str"),
    ("base.checkpoint=x=", "not an override hydra reads"),
])
def test_an_override_that_asks_for_more_than_data_exits_2_naming_it(place, capsys, override, message):
    line = placed(place, override)
    err = refused(place, capsys, line)
    assert f"override {line!r}: " in err and placed(place, message) in err


@pytest.mark.parametrize("arguments", [["--config-dir", "x"], ["--config=x.yaml"], ["-m", "base.checkpoint=a,b"],
                                       ["--experimental-rerun", "config.pickle"], ["--config", "a.yaml", "--config"]])
def test_the_engine_passes_hydra_no_option_but_config(arguments):
    """``python -m edgefuse.tools.llm_check`` and the others reach the engine without the command's parser:
    hydra's own options (another config folder, a multirun, a pickle to rerun) are refused there too."""
    with pytest.raises(ConfigRefused, match="export_llm's command line here is|give the config file"):
        config_check.check_command_line(arguments)


def test_overrides_of_llm_config_settings_pass():
    parsed = check_overrides(["base.checkpoint=c.pth", "+base.params=p.json", "++model.dtype_override=fp32",
                              "multimethod.methods=[{method_name: a}]", "multimethod.methods.0.method_name=b",
                              "base.checkpoint=${oc.env:HOME}/c.pth",
                              "export.max_context_length=${export.max_seq_length}"])
    assert len(parsed) == 7


# -- hydra reads the checked bytes, and writes only where edgefuse says ----------------------------


def test_hydra_reads_the_bytes_that_were_checked_not_the_file_again(place, monkeypatch):
    """A file swapped for a hostile one after the check: hydra reads the checked copy."""
    from edgefuse.llm.export import ConfigRejected, run_export_llm

    path = write_config(place, FAILS_SOON)
    read = config_check.read_config

    def read_then_swap(name):
        checked = read(name)
        with open(name, "w") as f:
            f.write(placed(place, CALLBACK + FAILS_SOON))
        return checked

    monkeypatch.setattr(config_check, "read_config", read_then_swap)
    with pytest.raises(ConfigRejected, match="missing.pth"):
        run_export_llm(["--config", path, f"+export.output_name={place['out'] / 'model.pte'}"])
    assert not place["marker"].exists()


@pytest.mark.parametrize("hydra_dir, compare", [(False, False), (True, False), (False, True)],
                         ids=["beside-the-pte", "hydra-dir", "compare-relative-output"])
def test_hydra_writes_its_record_and_log_beside_the_pte_or_in_hydra_dir_and_nowhere_else(
    place, capsys, hydra_dir, compare
):
    """An export that hydra starts and that fails in ExecuTorch (a missing checkpoint), run in a working
    folder of its own: the working folder and the config's are unchanged; hydra's files are in one folder.
    With ``--compare`` and the output named relative to the working folder (``out/model.pte``), stock's run
    comes first, in a staging folder of its own, and fails: its record goes with that folder, so nothing is
    left anywhere, in the working folder least of all."""
    path = write_config(place, FAILS_SOON)
    chosen = place["root"] / "hydra-record"
    if compare:
        (place["work"] / "out").mkdir()
    before = snapshot(place["root"])
    code = cli.main(["-q", "export-llm", "--config", path, *(["--hydra-dir", str(chosen)] if hydra_dir else []),
                     *(["--compare", "+export.output_name=out/model.pte"] if compare
                       else [f"+export.output_name={place['out'] / 'model.pte'}"])])
    err = capsys.readouterr().err
    assert code == USAGE and "missing.pth" in err, err
    changed = {p for p, h in snapshot(place["root"]).items() if before.get(p) != h}
    if compare:
        assert changed == set()
        return
    record = chosen if hydra_dir else place["out"]
    assert changed == {str(record / name) for name in (".hydra", ".hydra/config.yaml", ".hydra/hydra.yaml",
                                                       ".hydra/overrides.yaml", "export_llm.log")} | (
        {str(chosen)} if hydra_dir else set())


@pytest.mark.parametrize("folder", ["/tmp/a b/c", "/tmp/it's", "/tmp/x,y=z", "/tmp/back\\slash", "/tmp/end\\",
                                    "/tmp/end\\'", "/tmp/[a]{b}:c", "/tmp/é"])
def test_the_run_folder_reaches_hydra_as_named(folder):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (override,) = OverridesParser.create().parse_overrides([run_folder_override(folder)])
    assert (override.key_or_group, override.value()) == ("hydra.run.dir", folder)


def test_a_run_folder_hydra_would_interpolate_is_refused():
    with pytest.raises(ConfigRefused, match="hydra reads"):
        run_folder_override("/tmp/${oc.env:HOME}")


# -- no false refusal -------------------------------------------------------------------------------


def test_every_config_executorch_ships_passes_unless_executorch_rejects_it_too():
    """Each ``examples/models/*/config/*.yaml`` passes the check, or ExecuTorch's own merge with LlmConfig
    fails on it as well (qwen2_5_coder's ``metadata='...'`` is a key, not a setting)."""
    import executorch
    import yaml
    from omegaconf import OmegaConf
    from omegaconf._utils import get_yaml_loader

    paths = sorted(glob.glob(os.path.join(executorch.__path__[0], "examples", "models", "*", "config", "*.yaml")))
    assert len(paths) >= 18
    refusals = {}
    for path in paths:
        try:
            read_config(path)
        except ConfigRefused as error:
            refusals[os.path.basename(path)] = str(error)
            with open(path) as f, pytest.raises(Exception):
                OmegaConf.merge(OmegaConf.structured(config_check._llm_config()), yaml.load(f, get_yaml_loader()))
    assert set(refusals) <= {"qwen2_5_coder_xnnpack_q8da4w.yaml"}, refusals
