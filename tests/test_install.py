"""How edgefuse installs, read from the installed distribution (``importlib.metadata``): the Pythons it
declares, dependency ranges that say what it works with and never an exact pin, transformers only in the
``models`` extra, the ``edgefuse`` command, and the package data beside the code. The exact versions the
tests run on live in constraints.txt, which the README's install lines and ``.ci/run`` use.

``.ci/run`` runs this file twice: in the test environment (the editable install) and in a fresh
environment holding the built wheel alone, where the package data checks read the installed files."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import pkgutil
import re
import shlex

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import edgefuse
from tests.project import ROOT, pins, pyproject

#: The Pythons edgefuse is tested on (docs/install.md says how), and the nearest ones it does not claim.
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
NOT_CLAIMED = ("3.9.18", "3.14.0")
#: Pins and ranges are written with these; a version given with them alone is exact.
EXACT = {"==", "==="}


def _distribution() -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution("edgefuse")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("edgefuse is not installed: pip install -e '.[test]' -c constraints.txt")


def _environment(extra: str = "", python: str | None = None) -> dict[str, str]:
    """What a marker is evaluated against: ``extra`` ("" for the base dependencies) on ``python`` (this
    interpreter when None)."""
    environment = {"extra": extra}
    if python is not None:
        environment |= {"python_version": python, "python_full_version": f"{python}.0"}
    return environment


def installed(extra: str = "") -> dict[str, Requirement]:
    """The installed distribution's requirements for ``extra`` ("" for the base ones), by name, on this
    interpreter. An extra's requirements are those whose marker names it."""
    found = {}
    for requirement in map(Requirement, _distribution().requires or []):
        marker = requirement.marker
        if ("extra" in str(marker)) == (extra != "") and (marker is None or marker.evaluate(_environment(extra))):
            found[requirement.name] = requirement
    return found


def declared(extra: str = "", python: str | None = None) -> dict[str, Requirement]:
    """pyproject.toml's requirements for ``extra`` ("" for the base ones), by name, on ``python``."""
    project = pyproject()["project"]
    texts = project["dependencies"] if extra == "" else project["optional-dependencies"][extra]
    found = map(Requirement, texts)
    return {r.name: r for r in found if r.marker is None or r.marker.evaluate(_environment(python=python))}


def exact_pins(requirements: list[str]) -> list[str]:
    """The requirements among ``requirements`` that name one version rather than a range."""
    return [text for text in requirements if any(s.operator in EXACT for s in Requirement(text).specifier)]


def test_the_installed_distribution_is_this_trees():
    """The metadata the other tests read is pyproject.toml's: a stale install would check something else."""
    distribution = _distribution()
    project = pyproject()["project"]
    assert distribution.version == project["version"]
    assert SpecifierSet(distribution.metadata["Requires-Python"]) == SpecifierSet(project["requires-python"])
    for extra in ("", *project["optional-dependencies"]):
        assert {n: str(r.specifier) for n, r in installed(extra).items()} == {
            n: str(r.specifier) for n, r in declared(extra).items()
        }, f"the installed edgefuse is not this tree's ({extra or 'base'}): pip install -e '.[test]' -c constraints.txt"


def test_requires_python_admits_3_10_to_3_13():
    claimed = SpecifierSet(_distribution().metadata["Requires-Python"])
    assert all(claimed.contains(f"{python}.0") for python in PYTHONS), claimed
    assert not any(claimed.contains(python) for python in NOT_CLAIMED), claimed


def test_the_base_dependencies_are_the_executorch_minor_and_the_torch_it_pins():
    """ExecuTorch 1.5 and the torch it is built against, 2.13 (its wheels declare none): nothing more, and
    transformers, which only the built-in models use, not at all."""
    base = installed()
    assert set(base) == {"torch", "executorch"}, sorted(base)
    torch, executorch = base["torch"].specifier, base["executorch"].specifier
    assert [torch.contains(v) for v in ("2.13.0", "2.13.1", "2.12.1", "2.14.0")] == [True, True, False, False], torch
    assert [executorch.contains(v) for v in ("1.5.1", "1.5.9", "1.5.0", "1.6.0")] == [True, True, False, False], executorch


def test_the_models_extra_takes_a_transformers_every_built_in_model_builds_with():
    """transformers 5.0.0rc0 is the first release that builds and exports every built-in model (4.57.6
    fails Gemma3's decoder layer; docs/install.md); optimum-executorch 1.1.0 pins 5.0.0rc1, so the range
    takes the release candidates."""
    models = installed("models")
    assert set(models) == {"transformers"}, sorted(models)
    transformers = models["transformers"].specifier
    versions = ("5.0.0rc0", "5.0.0rc1", "5.23.0", "5.99.0", "4.57.6", "6.0.0")
    takes = [transformers.contains(v, prereleases=True) for v in versions]
    assert takes == [True, True, True, True, False, False], transformers


def test_the_test_extra_takes_the_models_and_the_test_tools():
    extras = set(_distribution().metadata.get_all("Provides-Extra") or [])
    assert extras == {"models", "test", "explorer", "hf"}
    test = installed("test")
    assert {"pytest", "pytest-xdist", "jsonschema", "import-linter", "grimp"} <= set(test), sorted(test)
    assert test["edgefuse"].extras == {"models"}


def test_the_hf_extra_takes_the_optimum_executorch_the_recipe_is_written_against():
    """edgefuse-xnnpack wraps optimum-executorch 1.1's xnnpack recipe (docs/hf.md): 1.x, not 2."""
    hf = installed("hf")
    assert set(hf) == {"optimum-executorch"}, sorted(hf)
    optimum = hf["optimum-executorch"].specifier
    assert [optimum.contains(v) for v in ("1.1.0", "1.9.0", "1.0.0", "2.0.0")] == [True, True, False, False], optimum


def test_no_requirement_is_an_exact_pin():
    """Every requirement the wheel declares, for any extra and any Python, is a range: an exact pin would
    stop edgefuse from installing beside a user's other tools. The pins are constraints.txt's."""
    assert exact_pins(_distribution().requires or []) == []


@pytest.mark.parametrize(("requirements", "pinned"), [
    (["torch>=2.13,<2.14", "executorch~=1.5.1"], []),
    (["torch==2.13.0", "executorch>=1.5.1,<1.6"], ["torch==2.13.0"]),
    (['transformers===5.23.0; extra == "models"'], ['transformers===5.23.0; extra == "models"']),
    (['pytest<10,==9.0.3; extra == "test"'], ['pytest<10,==9.0.3; extra == "test"']),
])
def test_the_pin_check_finds_an_exact_version(requirements, pinned):
    assert exact_pins(requirements) == pinned


def test_the_command_is_the_entry_point():
    [script] = [e for e in _distribution().entry_points if e.group == "console_scripts"]
    assert (script.name, script.value) == ("edgefuse", "edgefuse.cli:main")
    import edgefuse.cli

    assert script.load() is edgefuse.cli.main


def test_the_package_data_is_installed_beside_the_code():
    """What edgefuse reads at run time (the report's JSON schema, the QNN device config's C source) and each
    layer's README, read from wherever ``edgefuse`` is imported from: the wheel's files in .ci/run's fresh
    environment."""
    schema = json.loads(importlib.resources.files("edgefuse.compare").joinpath("report.schema.json").read_text())
    assert schema["type"] == "object"
    config = importlib.resources.files("edgefuse.qnn").joinpath("htp_device_config.c").read_text()
    assert "#include" in config
    layers = [i.name for i in pkgutil.iter_modules(edgefuse.__path__) if i.ispkg]
    assert len(layers) >= 10, layers
    missing = [name for name in layers if not importlib.resources.files(f"edgefuse.{name}").joinpath("README.md").is_file()]
    assert missing == []


def test_the_test_pins_are_exact_whole_and_within_the_declared_ranges():
    """On each Python edgefuse claims, constraints.txt pins every requirement of the base, ``models`` and
    ``test`` once, to one version that the declared range takes."""
    wrong = []
    for python in PYTHONS:
        here = [pin for pin in pins() if pin.marker is None or pin.marker.evaluate(_environment(python=python))]
        for pin in here:
            if [s.operator for s in pin.specifier] != ["=="]:
                wrong.append(f"{python}: {pin} is not one version")
        versions = {}
        for pin in here:
            versions.setdefault(pin.name, []).append(next(iter(pin.specifier)).version)
        for extra in ("", "models", "test"):
            for name, requirement in declared(extra, python).items():
                if name == "edgefuse":
                    continue
                found = versions.get(name, [])
                if len(found) != 1:
                    wrong.append(f"{python}: {name} pinned {len(found)} times")
                elif not requirement.specifier.contains(found[0], prereleases=True):
                    wrong.append(f"{python}: {name}=={found[0]} is outside {requirement.specifier}")
    assert wrong == []


#: A ``pip install`` (or a venv's ``".../bin/pip" install``) and its arguments, up to the end of the command.
INSTALLS = re.compile(r"pip\"? install ([^&;]*)")


def edgefuse_installs(text: str) -> list[list[str]]:
    """The arguments of each ``pip install`` on a line of ``text`` that is not a comment, that installs
    edgefuse (its arguments name the project folder, an extra of it, or a built wheel) and is not a dry run."""
    found = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for arguments in INSTALLS.findall(line):
            words = shlex.split(arguments)
            project = any(w == "." or w.startswith(".[") or ".whl" in w or "$wheel" in w for w in words)
            if project and "--dry-run" not in words:
                found.append(words)
    return found


def takes_the_pins(words: list[str]) -> bool:
    return any(option == "-c" and value.endswith("constraints.txt") for option, value in zip(words, words[1:]))


def test_the_readme_and_ci_install_edgefuse_with_the_test_pins():
    """Each install of edgefuse in the README and in .ci/run takes constraints.txt, and the README's demo
    line installs the built-in models the demo builds."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text() + (ROOT / ".ci" / "package").read_text()
    installs = edgefuse_installs(readme) + edgefuse_installs(ci)
    assert len(edgefuse_installs(readme)) >= 2 and len(edgefuse_installs(ci)) >= 2, installs
    assert [words for words in installs if not takes_the_pins(words)] == []
    demo = [line for line in readme.splitlines() if "pip install" in line and "edgefuse demo" in line]
    assert len(demo) == 1 and re.search(r"\.\[[\w,]*models", demo[0]), demo
