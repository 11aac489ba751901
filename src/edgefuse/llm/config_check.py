"""An ``export_llm`` config and its overrides checked as data, before hydra sees either.

Hydra does more with a config than read its values: it instantiates the ``_target_`` of each
``hydra.callbacks`` entry (a callable the config names, called with arguments the config chooses),
writes its job log to the file ``hydra.job_logging`` names, makes its run folder where ``hydra.run.dir``
says, loads the config files a ``defaults`` list or a config-group override names, moves a file's keys
elsewhere with a ``# @package`` header, and calls the resolvers a value names. ExecuTorch itself loads
the shared library ``export.so_library`` names and writes its profile to ``debug.profile_path``.

So a config holds ExecuTorch's ``LlmConfig`` settings and nothing else (:func:`check_config`): each key
a field of ``LlmConfig`` (down its nested dataclasses and their lists, ``multimethod.methods`` among
them), a mapping or a list only where the field is one, no ``hydra`` key, no ``_target_``, ``defaults``
only ``[_self_]``, no header, no resolver but those of :data:`RESOLVERS` (``${a.b}`` reads another
setting), and the settings of :data:`COMMAND_LINE_ONLY` left to the command line. Overrides, parsed with
hydra's own parser, follow the same rules (:func:`check_overrides`), with no deletion (``~``), config
group, package or sweep. Nothing here imports, runs or resolves what a config names; the file is read
once (:func:`read_config`) and hydra is to be handed those bytes, not the file's name.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import typing
from dataclasses import dataclass
from typing import Any, Sequence

#: The most bytes a config file (or one override) may hold: ExecuTorch's own configs hold about one KB,
#: and omegaconf's parser takes seconds on 64 KB of long interpolations.
MAX_CONFIG_BYTES = 32 << 10

#: The deepest nesting of ``{`` and ``[`` (``${`` among them) a value with an interpolation, or an override,
#: may hold: omegaconf's and hydra's parsers recurse on each level and take seconds to fail past a few
#: hundred. ExecuTorch's values nest one level.
MAX_NESTING = 32

#: The most values (mappings, lists and scalars, each alias counted each time it is used) a config or an
#: override may hold: ``LlmConfig`` has about 150 settings, and YAML aliases that repeat a list inside a
#: list would otherwise multiply past any memory.
MAX_VALUES = 100_000

#: The resolvers a value may call, each with why it is needed and what it does. A plain node interpolation
#: (``${export.max_seq_length}``) reads another setting and is always allowed.
RESOLVERS = {
    "oc.env": "reads one environment variable and nothing else; ExecuTorch's Qwen3 LoRA configs "
              "(examples/models/qwen3/config/) name their adapter files with it",
}

#: Settings of ``LlmConfig`` a config file may not make, with the reason: ExecuTorch runs or writes what
#: they name. An override may set them: it is typed by the person who runs the command.
COMMAND_LINE_ONLY = {
    "export.so_library": "ExecuTorch loads the shared library it names (torch.ops.load_library), which runs "
                         "that library's code",
    "debug.profile_path": "ExecuTorch writes its profile to that path, whatever file is there",
}

_SCALARS = (str, int, float, bool, type(None))


class ConfigRefused(ValueError):
    """A config or override asks hydra or ExecuTorch for more than data; the message names the key."""


# --- LlmConfig's shape ---------------------------------------------------------------------------------


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    """The fields of the dataclass ``cls`` and their types, ``Optional`` taken off."""
    hints = typing.get_type_hints(cls)
    return {f.name: _unwrap(hints[f.name]) for f in dataclasses.fields(cls)}


def _unwrap(kind: Any) -> Any:
    if typing.get_origin(kind) is typing.Union:
        rest = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return kind


def _element(kind: Any) -> Any:
    """The element type of a ``List[...]`` field, or None for any other type."""
    return _unwrap(typing.get_args(kind)[0]) if typing.get_origin(kind) is list else None


def _name(kind: Any) -> str:
    element = _element(kind)
    if element is not None:
        return f"a list of {_name(element)}"
    return getattr(kind, "__name__", str(kind))


def _llm_config() -> type:
    from executorch.extension.llm.export.config.llm_config import LlmConfig

    return LlmConfig


# --- values --------------------------------------------------------------------------------------------


class _Walk:
    """One walk of a config or an override's value against ``LlmConfig``: counts the values it visits."""

    def __init__(self, where: str):
        self.where = where
        self.values = 0

    def refuse(self, path: str, reason: str) -> ConfigRefused:
        return ConfigRefused(f"{self.where}: {path}: {reason}" if path else f"{self.where}: {reason}")

    def value(self, value: Any, kind: Any, path: str) -> None:
        """Check ``value`` where ``LlmConfig`` has a field of type ``kind`` at ``path``."""
        self.values += 1
        if self.values > MAX_VALUES:
            raise self.refuse(path, f"the config holds more than {MAX_VALUES:,} values (YAML aliases count each "
                                    "time they are used); ExecuTorch's configs hold a few dozen")
        if isinstance(value, dict):
            if not dataclasses.is_dataclass(kind):
                raise self.refuse(path, f"a mapping where LlmConfig has {_name(kind)}")
            for key, item in value.items():
                self.value(item, self.field(kind, key, path), _join(path, key))
        elif isinstance(value, list):
            element = _element(kind)
            if element is None:
                raise self.refuse(path, f"a list where LlmConfig has {_name(kind)}")
            for i, item in enumerate(value):
                self.value(item, element, f"{path}[{i}]")
        elif isinstance(value, _SCALARS):
            if isinstance(value, str):
                self.interpolations(value, path)
        else:
            raise self.refuse(path, f"a {type(value).__name__} (a YAML tag): a config holds strings, numbers, "
                                    "booleans, null, mappings and lists")

    def field(self, cls: type, key: Any, path: str) -> Any:
        """The type of the field ``key`` of ``cls``; a key ``cls`` does not have is refused."""
        fields = _fields(cls)
        if key == "_target_":
            raise self.refuse(_join(path, key), TARGET_REASON)
        if not isinstance(key, str) or key not in fields:
            where = f"{cls.__name__} ({path})" if path else "LlmConfig"
            raise self.refuse(_join(path, key), f"not a setting of ExecuTorch's {where}, which has: "
                                                f"{', '.join(fields)}")
        return fields[key]

    def interpolations(self, text: str, path: str) -> None:
        """Refuse a resolver in ``text`` other than those of :data:`RESOLVERS`, as omegaconf parses it."""
        if "${" not in text:
            return
        if _nesting(text) > MAX_NESTING:
            raise self.refuse(path, f"interpolations nested more than {MAX_NESTING} deep")
        resolver = _resolver_outside(text)
        if resolver is not None:
            allowed = ", ".join(f"${{{r}:...}}" for r in RESOLVERS)
            raise self.refuse(path, f"{text!r} {resolver}: a value may interpolate other settings (${{a.b}}) "
                                    f"and call {allowed} only")


#: Why a ``_target_`` key is refused, wherever it is.
TARGET_REASON = "hydra instantiates what a _target_ names (it calls it); a config holds settings only"


def _first_target(value: Any, path: str, seen: set[int]) -> str | None:
    """The path of the first ``_target_`` key anywhere in ``value``, or None: found before ExecuTorch's
    schema is imported, and wherever it sits (a mapping where the schema has a string included). Each
    mapping or list is visited once, so YAML aliases cannot multiply the walk."""
    if not isinstance(value, (dict, list)) or id(value) in seen:
        return None
    seen.add(id(value))
    items = value.items() if isinstance(value, dict) else ((f"[{i}]", item) for i, item in enumerate(value))
    for key, item in items:
        here = f"{path}{key}" if isinstance(value, list) else _join(path, key)
        if key == "_target_" and isinstance(value, dict):
            return here
        found = _first_target(item, here, seen)
        if found is not None:
            return found
    return None


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _nesting(text: str) -> int:
    """How deep ``{`` and ``[`` nest in ``text`` (an upper bound: quotes are not told apart)."""
    depth = deepest = 0
    for char in text:
        if char in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "}]":
            depth = max(depth - 1, 0)
    return deepest


@functools.lru_cache(maxsize=1024)
def _resolver_outside(text: str) -> str | None:
    """What is wrong with the interpolations of ``text`` as omegaconf parses it (a resolver not in
    :data:`RESOLVERS`, or no parse), or None; a text an alias repeats is parsed once."""
    from omegaconf.errors import GrammarParseError
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser
    from omegaconf.grammar_parser import parse

    try:
        nodes = [parse(text)]
    except GrammarParseError as error:
        return f"is not a value omegaconf reads ({error})"
    while nodes:
        node = nodes.pop()
        if isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext):
            name = node.resolverName().getText()
            if name not in RESOLVERS:
                return f"calls the resolver {name!r}"
        nodes.extend(node.getChildren() if hasattr(node, "getChildren") else ())
    return None


# --- the config file -----------------------------------------------------------------------------------


def read_config(path: str) -> tuple[bytes, dict]:
    """The bytes of the config file ``path`` and the settings they hold, read once and checked
    (:func:`check_config`); hydra is to be handed these bytes. Raises :class:`ConfigRefused`."""
    from edgefuse.runtime.files import NotARegularFile, TooLarge, read_regular

    where = f"--config {path}"
    try:
        raw = read_regular(path, MAX_CONFIG_BYTES, "an export_llm config")
    except FileNotFoundError:
        raise ConfigRefused(f"{where}: no such file") from None
    except (NotARegularFile, TooLarge) as error:
        raise ConfigRefused(f"{where}: {error}") from None
    except OSError as error:
        raise ConfigRefused(f"{where}: cannot be read: {error.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigRefused(f"{where}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    _check_header(text, where)
    return raw, check_config(_parse(text, where), where)


def _check_header(text: str, where: str) -> None:
    """Refuse a hydra header (``# @package NAME`` before the first setting): it would move the file's keys
    under another key, where the check did not read them."""
    from hydra.plugins.config_source import ConfigSource

    try:
        header = ConfigSource._get_header_dict(text)
    except ValueError as error:
        raise ConfigRefused(f"{where}: a malformed hydra header: {error}") from None
    if header != {"package": None}:
        names = ", ".join(f"# @{key} {value}" for key, value in header.items() if value is not None)
        raise ConfigRefused(f"{where}: the hydra header {names!r}: it moves the file's settings elsewhere in "
                            "hydra's config; a config's settings stand where they are written")


def _parse(text: str, where: str) -> Any:
    """``text`` as omegaconf reads YAML (its loader: no Python tags, duplicate keys refused), unresolved."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    try:
        return yaml.load(text, Loader=get_yaml_loader())
    except yaml.YAMLError as error:
        raise ConfigRefused(f"{where}: not YAML that omegaconf reads: {error}") from None
    except RecursionError:
        raise ConfigRefused(f"{where}: nested deeper than a YAML reader follows") from None


def check_config(data: Any, where: str = "the config") -> dict:
    """The settings of a parsed config ``data`` without its ``defaults``, once checked (see the module);
    raises :class:`ConfigRefused` naming the first key that is more than data."""
    if data is None:
        return {}
    walk = _Walk(where)
    if not isinstance(data, dict):
        raise walk.refuse("", f"a {type(data).__name__} where a config is a mapping of LlmConfig's sections")
    if "hydra" in data:
        raise walk.refuse(_hydra_keys(data["hydra"]), HYDRA_REASON)
    target = _first_target(data, "", set())
    if target is not None:
        raise walk.refuse(target, TARGET_REASON)
    settings = {}
    for key, value in data.items():
        if key == "defaults":
            _check_defaults(value, walk)
            continue
        walk.value(value, walk.field(_llm_config(), key, ""), str(key))
        settings[key] = value
    for path, reason in COMMAND_LINE_ONLY.items():
        section, name = path.split(".")
        if isinstance(settings.get(section), dict) and settings[section].get(name) is not None:
            raise walk.refuse(path, f"{reason}; set it on the command line ({path}=...) if you mean it")
    return settings


#: Why a ``hydra`` key is refused, in a config and in an override.
HYDRA_REASON = ("hydra's own settings are edgefuse's to make: hydra instantiates its callbacks, writes its job log "
                "where its logging settings say and makes its run folder where they say; export-llm writes them "
                "beside the .pte (or in --hydra-dir)")


def _hydra_keys(value: Any) -> str:
    """``hydra`` and the keys under it, to name in the refusal."""
    if isinstance(value, dict) and value:
        return ", ".join(f"hydra.{key}" for key in value)
    return "hydra"


def _check_defaults(value: Any, walk: _Walk) -> None:
    """A ``defaults`` list may name the file itself (``_self_``) only: any other entry loads another file
    (or a hydra config group) into the config."""
    entries = value if isinstance(value, list) else [value]
    for i, entry in enumerate(entries):
        if entry != "_self_":
            raise walk.refuse(f"defaults[{i}]", f"{entry!r}: hydra would load that config into this one; a "
                                                "config's defaults may be [_self_] only")


# --- overrides -----------------------------------------------------------------------------------------


def check_overrides(overrides: Sequence[str]) -> list:
    """hydra's parse of ``overrides`` (``key=value``, ``+key=value``, ``++key=value``), once each is a setting
    of ``LlmConfig`` with a value that is data; raises :class:`ConfigRefused` naming the override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for line in overrides:
        walk = _Walk(f"override {line[:200]!r}" + ("..." if len(line) > 200 else ""))
        if len(line) > MAX_CONFIG_BYTES or _nesting(line) > MAX_NESTING:
            raise walk.refuse("", f"longer than {MAX_CONFIG_BYTES:,} characters or nested more than "
                                  f"{MAX_NESTING} deep")
        try:
            (override,) = parser.parse_overrides([line])
        except HydraException as error:
            raise walk.refuse("", f"not an override hydra reads: {str(error).splitlines()[0]}") from None
        key = override.key_or_group
        if key.split(".")[0].split("/")[0] == "hydra":
            raise walk.refuse(key, HYDRA_REASON)
        if override.type == OverrideType.DEL:
            raise walk.refuse(key, "deletes a setting (~): an override sets a setting of LlmConfig")
        if "/" in key or override.package is not None:
            raise walk.refuse(key, "selects a hydra config group or package, which loads another config file; "
                                   "an override sets a setting of LlmConfig")
        if override.is_sweep_override():
            raise walk.refuse(key, "a sweep of values: export-llm runs one export")
        walk.value(override.value(), _key_type(key, walk), key)
        parsed.append(override)
    return parsed


def _key_type(key: str, walk: _Walk) -> Any:
    """The type of the setting at the dotted ``key`` (``multimethod.methods.0.method_name`` indexes a list)."""
    kind: Any = _llm_config()
    path = ""
    for part in key.split("."):
        element = _element(kind)
        if element is not None and part.isdigit():
            kind = element
        elif dataclasses.is_dataclass(kind):
            kind = walk.field(kind, part, path)
        else:
            raise walk.refuse(_join(path, part), f"not a setting: {path} is {_name(kind)}")
        path = _join(path, part)
    return kind


# --- the command line ----------------------------------------------------------------------------------


@dataclass
class CheckedCommandLine:
    """``export_llm``'s command line, checked: the config file's bytes (what hydra is handed), its settings,
    the overrides as given and as hydra parses them."""

    config: bytes | None
    settings: dict
    overrides: list[str]
    parsed: list

    def composed(self):
        """The ``LlmConfig`` (an omegaconf ``DictConfig``, unresolved) the settings and overrides make, as
        hydra and export_llm merge them; raises omegaconf's error for a value ``LlmConfig`` does not take."""
        from omegaconf import OmegaConf

        config = OmegaConf.merge(OmegaConf.structured(_llm_config()), self.settings)
        for override in self.parsed:
            OmegaConf.update(config, override.key_or_group, override.value(), merge=True)
        return config


def check_command_line(args: Sequence[str]) -> CheckedCommandLine:
    """``[--config FILE] [OVERRIDES...]`` (``--config`` anywhere, once) checked: the file read and checked
    once, each override checked; any other option is refused (hydra's own would run or write what they name)."""
    args = list(args)
    path = None
    if "--config" in args:
        at = args.index("--config")
        if at + 1 >= len(args):
            raise ConfigRefused("--config: give the config file to read")
        path = args[at + 1]
        del args[at:at + 2]
    options = [a for a in args if a.startswith("-")]
    if options:
        raise ConfigRefused(f"{options[0]}: export_llm's command line here is [--config FILE] and overrides "
                            "key=value; hydra's own options are not passed on")
    raw, settings = read_config(path) if path is not None else (None, {})
    return CheckedCommandLine(raw, settings, args, check_overrides(args))


def run_folder_override(folder: str) -> str:
    """The override that makes ``folder`` hydra's run folder (its ``.hydra`` record and job log): the
    absolute path, quoted as hydra's grammar reads it (a backslash escapes only a quote or the end)."""
    folder = os.path.abspath(folder)
    if "${" in folder:
        raise ConfigRefused(f"{folder}: hydra reads '${{' in its run folder's name as an interpolation; name "
                            "another folder for hydra's record (--hydra-dir)")
    escaped = re.sub(r"(\\*)('|\Z)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), folder)
    return f"hydra.run.dir='{escaped}'"
