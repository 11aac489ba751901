"""Mutated ``export-llm`` configs for :mod:`edgefuse.fuzz.trust`: ExecuTorch's own configs changed byte by
byte, key by key, and with what a hostile config asks hydra or ExecuTorch for.

The starting files are the configs ExecuTorch ships (``examples/models/*/config/*.yaml``). A mutant is
read as ``edgefuse export-llm --config FILE`` reads it (:func:`edgefuse.llm.export.run_export_llm`, hydra
included) up to ExecuTorch's ``export_llama``, which is not run: the measure stops where the export would
start, and checks that the config it would have exported is the one the checked settings make.
"""

from __future__ import annotations

import copy
import glob
import os
import random

import yaml

#: Hostile settings and their places: what hydra instantiates, where it logs and runs, the files a
#: config loads, the resolvers it calls, the headers that move its keys; {code} creates the marker and
#: {decoy} is the file outside. Each is one YAML text, added to a config at its top level.
HOSTILE = (
    "hydra:\n  callbacks:\n    planted:\n      _target_: builtins.exec\n      _args_: [\"{code}\"]\n",
    "hydra:\n  job_logging:\n    handlers:\n      file:\n        class: logging.FileHandler\n        filename: {decoy}\n",
    "hydra:\n  run:\n    dir: {outside}/run\n",
    "hydra:\n  output_subdir: {outside}\n",
    "export:\n  _target_: builtins.exec\n  _args_: [\"{code}\"]\n",
    "_target_: builtins.exec\n_args_: [\"{code}\"]\n",
    "defaults:\n  - other_config\n  - _self_\n",
    "defaults:\n  - override hydra/job_logging: default\n  - _self_\n",
    "# @package _global_\nhydra:\n  run:\n    dir: {outside}\n",
    "# @package base\nmodel_class: llama3\n",
    "export:\n  so_library: {decoy}\n",
    "debug:\n  profile_path: {decoy}\n",
    "export:\n  output_dir: ${{python:\"{code}\"}}\n",
    "export:\n  output_name: ${{oc.create:{{a: 1}}}}\n",
    "export:\n  output_name: ${{oc.decode:\"${{oc.env:HOME}}\"}}\n",
    "base:\n  model_class: !!python/object/apply:os.system [\"{code}\"]\n",
    "base:\n  params: &a [*a]\n",
    "a: &a [1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n"
    "d: &d [*c, *c, *c, *c, *c, *c, *c, *c]\ne: [*d, *d, *d, *d, *d, *d, *d, *d]\n",
    "export:\n  max_seq_length: ${{export.max_seq_length}}\n",
    "export:\n  max_seq_length: " + "[" * 200 + "]" * 200 + "\n",
)

#: Values a mutation sets a setting to: each scalar type, interpolations, lists, mappings, and text a
#: reader could mistake for more.
VALUES = (
    0, 1, -1, 1 << 40, 10 ** 30, 0.5, float("nan"), float("inf"), True, False, None, "", "llama3", "fp32",
    "8da4w", "xnnpack", "${export.max_seq_length}", "${base.model_class}", "${oc.env:HOME}", "${nope}",
    "${oc.env:HOME,${export.output_dir}}", "${}", "$", "~", "/", "../x", [], [1, "a"], {}, {"a": 1},
    {"_target_": "builtins.print"}, "???", "\x00", "a" * 4000,
)


def bases(targets) -> list[bytes]:
    """ExecuTorch's export_llm configs, as shipped; the modules the read needs are imported here, once,
    so that each child forked to read a mutant has them."""
    import executorch

    import edgefuse.llm.config_check  # noqa: F401
    import edgefuse.llm.export  # noqa: F401
    import executorch.extension.llm.export.export_llm  # noqa: F401

    found = sorted(glob.glob(os.path.join(executorch.__path__[0], "examples", "models", "*", "config", "*.yaml")))
    out = []
    for path in found:
        with open(path, "rb") as f:
            out.append(f.read())
    return out


def mutate(rng: random.Random, base: bytes, targets) -> bytes:
    """One mutation of a config: its bytes, its keys and values, or a hostile setting added."""
    from edgefuse.fuzz.trust import code_that_touches, mutate_bytes

    how = rng.choice(("bytes", "structure", "structure", "structure", "hostile", "hostile"))
    if how == "bytes":
        return mutate_bytes(rng, base)
    if how == "hostile":
        text = rng.choice(HOSTILE).format(code=code_that_touches(targets.marker).replace('"', "'"),
                                          decoy=targets.decoy, outside=targets.outside)
        return _merged(base, text, rng)
    data = yaml.safe_load(base) or {}
    for _ in range(rng.choice((1, 1, 2, 3))):
        data = _edit(rng, data)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()


def _merged(base: bytes, text: str, rng: random.Random) -> bytes:
    """``base`` with the YAML ``text`` in it: its settings merged into the config's own sections (a text
    of plain YAML, most times), else the text before or after the file (a header only counts before)."""
    plain = not any(sign in text for sign in ("#", "!!", "&", "{"))
    if plain and rng.random() < 0.7:
        data, extra = yaml.safe_load(base) or {}, yaml.safe_load(text)
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key].update(value)
            else:
                data[key] = value
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()
    if text.startswith("#") or rng.random() < 0.5:
        return text.encode() + b"\n" + base
    return base + b"\n" + text.encode()


def _edit(rng: random.Random, data):
    """One change of the parsed config ``data`` (changed in place, and returned): a value set, a key
    renamed, dropped or added, a section moved under another."""
    from edgefuse.fuzz.trust import _json_set, _paths

    path = rng.choice(_paths(data))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    value = parent[path[-1]] if path else data
    how = rng.choice(("set", "set", "rename", "drop", "add", "move"))
    if how == "add" and isinstance(value, dict):
        value[rng.choice(("_target_", "hydra", "defaults", "nope", "model_class", "enabled", 7, "a.b"))] = rng.choice(VALUES)
        return data
    if how == "set" or not path or not isinstance(parent, dict):
        return _json_set(data, path, copy.deepcopy(rng.choice(VALUES)))
    del parent[path[-1]]
    if how == "rename":
        parent[rng.choice((f"{path[-1]}_x", str(path[-1]).upper(), "_target_", "hydra"))] = value
    elif how == "move":
        sections = [item for item in parent.values() if isinstance(item, dict)]
        if sections:
            rng.choice(sections)[path[-1]] = value
    return data


class _Reached(BaseException):
    """Raised by the stand-in for ``export_llama``: the read stops where the export would start. A
    ``BaseException``, so that neither hydra nor ``run_export_llm`` takes it for the config's failure."""


def read(path: str, folder: str) -> str:
    """What ``edgefuse export-llm --config PATH --hydra-dir FOLDER`` does before it exports: the config and
    its settings checked, hydra run on the checked bytes with its record in ``folder``, up to
    ``export_llama``, which a stand-in replaces. "refused" for an error the command turns into exit 2 (or
    the QNN set-up's exit), "accepted" when the stand-in is reached with the ``LlmConfig`` the checked
    settings make; raises otherwise, and when it is reached with any other."""
    from omegaconf import OmegaConf

    import executorch.extension.llm.export.export_llm as entry
    from edgefuse.fuzz.trust import refusal
    from edgefuse.llm.config_check import ConfigRefused, check_command_line
    from edgefuse.llm.export import ConfigRejected, QnnExportFailed, run_export_llm
    from edgefuse.qnn.sdk import QnnSdkUnavailable

    reached = []

    def export_llama(config):
        reached.append(config)
        raise _Reached

    entry.export_llama = export_llama  # in the child forked for this file alone
    try:
        run_export_llm(["--config", path], hydra_dir=folder)
    except _Reached:
        pass
    except (ConfigRefused, ConfigRejected, QnnExportFailed, QnnSdkUnavailable, SystemExit) as error:
        return refusal(error)
    if not reached:
        raise RuntimeError("run_export_llm returned without reaching export_llama")
    checked = OmegaConf.to_object(check_command_line(["--config", path]).composed())
    if reached[0] != checked:
        raise RuntimeError("export_llama was handed another config than the checked settings make")
    return "accepted"
