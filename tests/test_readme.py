"""The README and the guides in docs/ say what works: their examples run and their links lead somewhere.

- Every Python example in README.md and docs/*.md that imports edgefuse has its imports run, every
  ``edgefuse`` name it reaches resolved and public, and each call of edgefuse bound to its signature
  without running it; the README's core example runs whole (slow: it exports tiny Qwen3). Running every
  example took minutes and QNN's libraries, for what the signatures check in a second.
- Every command the README shows, in a code block or in its tables, exists and takes each option it
  names (its ``--help`` lists them), and an ``edgefuse`` line parses as written. The code blocks'
  commands run whole (slow: a minute or two each); ``NOT_RUN_WHOLE`` says why one does not. The tables'
  commands are run with ``--help`` alone: the edgefuse commands there are the code blocks' in brief, and
  the measures take minutes (``quant``, ``qnn_check``, ``check_models``, ``llm_check``) to hours
  (``llm_latency``, ``xnnpack_bench`` on an idle machine), which is why they are commands and not tests.
- docs/commands.md names every option of every command, so the reference stays whole.
- Every ``edgefuse.NAME`` the documents mention is a module or a name in one, the README stays under
  200 lines, and every relative link in README.md and docs/ leads to a file (and a heading) that exists.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.optional import require_optimum

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = (README, *sorted((ROOT / "docs").glob("*.md")))

#: The README is an overview a newcomer reads in five minutes; the rest lives in docs/.
README_LINES = 200

#: The programs a README command line may start with, and how the test calls each in this process: the
#: ``edgefuse`` entry point is :func:`edgefuse.cli.main`, a ``python -m`` module its ``main``.
EDGEFUSE, PYTHON_M = "edgefuse", "python -m "

#: A fenced code block: its indent (a list item's), its language, its text.
FENCED = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)

#: Code-block commands the test runs only with ``--help``, and why not whole.
NOT_RUN_WHOLE = {
    "edgefuse demo": "run whole by tests/cli/test_private_paths.py::test_the_demo_prints_its_tables_and_map_and_"
    "writes_nothing_through_a_planted_folder_or_symlink (minutes: it lowers and runs two programs); not run twice",
    "edgefuse lower tiny-qwen3 --dtype float16 -o qwen3.pte": "the demo's float16 lowering of tiny-qwen3 both ways, "
    "run whole by the same demo test; the line is parsed with the command's own parser",
}


# -- reading the documents -----------------------------------------------------------------------------


def python_examples(path: Path) -> list[str]:
    """The fenced ```python blocks of ``path``, in order."""
    return [textwrap.dedent(block) for language, block in fenced_blocks(path.read_text()) if language == "python"]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Each fenced block of ``text`` as its language and its lines, also where a list item indents it."""
    return [(language, block) for _, language, block in FENCED.findall(text)]


def code_block_lines(path: Path) -> list[str]:
    """The lines of ``path``'s code blocks that are not Python: fenced blocks of another language and
    blocks indented by four spaces, with continued lines (``\\``) joined."""
    text = path.read_text()
    lines = []
    for language, block in fenced_blocks(text):
        lines += textwrap.dedent(block).splitlines() if language != "python" else []
    outside_fences = FENCED.sub("", text)
    lines += [line[4:] for line in outside_fences.splitlines() if line.startswith("    ")]
    joined, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            joined.append(" ".join((pending + line).split()))
            pending = ""
    return joined


@dataclass(frozen=True)
class Command:
    """A command line as the README writes it: the program (``edgefuse`` or ``python -m MODULE``), the
    command words that pick its parser, and the rest."""

    text: str
    program: str
    words: tuple[str, ...]

    @property
    def path(self) -> tuple[str, ...]:
        """The words that name the (sub)command: ``qnn setup``, ``report``, or none for a module."""
        if self.program != EDGEFUSE or not self.words:
            return ()
        return tuple(self.words[:2]) if self.words[0] == "qnn" else tuple(self.words[:1])

    @property
    def options(self) -> list[str]:
        """The options the line names (``--dtype`` of ``--dtype float16``, ``-o``)."""
        return [word.split("=", 1)[0] for word in self.words if word.startswith("-")]

    @property
    def overrides(self) -> list[str]:
        """export_llm's ``key=value`` overrides on the line."""
        return [word for word in self.words if "=" in word and not word.startswith("-")]


def command(text: str) -> Command | None:
    """``text`` as a :class:`Command`, or None when it runs neither ``edgefuse`` nor an edgefuse module.
    Brackets around what may be left out (``[--config FILE]``) are dropped, and a trailing comment."""
    text = re.sub(r"\s+#.*$", "", text).strip()
    words = shlex.split(text.replace("[", "").replace("]", ""))
    if words[:1] == [EDGEFUSE]:
        return Command(text, EDGEFUSE, tuple(words[1:]))
    if words[:2] == ["python", "-m"] and words[2:3] and words[2].split(".")[0] == EDGEFUSE:
        return Command(text, words[2], tuple(words[3:]))
    return None


def readme_block_commands() -> list[Command]:
    """Each edgefuse command of a README code block. An install line's ``pip install ... &&`` is not run
    (it would change the environment the tests run in), nor ``python -m pytest`` (the suite itself)."""
    found = []
    for line in code_block_lines(README):
        for part in line.split("&&"):
            if (parsed := command(part)) is not None:
                found.append(parsed)
    return found


def readme_table_commands() -> list[Command]:
    """The commands in the first column of the README's tables."""
    cells = re.findall(r"^\| `([^|]*?)`(?:, `([^|]*?)`)? \|", README.read_text(), re.M)
    return [parsed for cell in cells for text in cell if text and (parsed := command(text)) is not None]


def resolve(dotted: str):
    """The object ``dotted`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as error:
            if error.name is None or not ".".join(parts[:cut]).startswith(error.name):
                raise
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise ModuleNotFoundError(dotted)


def help_text(found: Command, capsys) -> str:
    """What ``--help`` prints for the command ``found`` names; it must exit 0."""
    if found.program == EDGEFUSE:
        from edgefuse import cli

        main, argv = cli.main, [*found.path, "--help"]
    else:
        main, argv = resolve(found.program).main, ["--help"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    out = capsys.readouterr().out
    assert done.value.code == 0, f"{found.text}: --help exited {done.value.code}"
    return out


def options_in_help(text: str) -> set[str]:
    """The options a ``--help`` text lists (its lines that start with an option), ``--help`` aside."""
    listed = set()
    for line in text.splitlines():
        if re.match(r"\s+-", line):
            column = re.split(r"\s{2,}", line.strip())[0]
            listed |= set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", column))
    return listed - {"-h", "--help"}


def named_in(option: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


# -- the documents as a whole ------------------------------------------------------------------------------


def test_the_readme_is_under_200_lines():
    lines = len(README.read_text().splitlines())
    assert lines < README_LINES, f"README.md has {lines} lines: move detail to docs/"


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> set[str]:
    """The anchors of ``path``'s headings (lines starting with ``#`` outside its code blocks)."""
    text = FENCED.sub("", path.read_text())
    return {_slug(heading) for heading in re.findall(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(document):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        name, _, anchor = target.partition("#")
        linked = (document.parent / name).resolve() if name else document
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in headings(linked):
            broken.append(f"{target}: no such heading in {linked.relative_to(ROOT)}")
    assert not broken, f"{document.relative_to(ROOT)}: {broken}"


def test_every_edgefuse_name_the_documents_mention_exists():
    """``edgefuse.a.b`` in the text (a module, a function, a class) is importable as written: the names
    follow the package when a module moves. ``NAME`` stands for any tool."""
    missing = {}
    for document in DOCUMENTS:
        for dotted in sorted(set(re.findall(r"\bedgefuse(?:\.[A-Za-z_]\w*)+", document.read_text()))):
            if dotted.endswith(".NAME"):
                continue
            try:
                resolve(dotted)
            except (ImportError, AttributeError) as error:
                missing[dotted] = f"{document.relative_to(ROOT)}: {error}"
    assert not missing, missing


#: In a document, a test file (``tests/cli/test_trust_pt2.py``), a letter it stands for (``... (T)``,
#: then ``T `test_...```), and a test name, in the order they are written.
_TEST_FILE, _LEGEND_USE, _TEST_NAME = r"`(tests/[\w/*]+\.py)`", r"(?<![\w`])([A-Z])(?=,?\s+`)", r"`(test_\w+)`"


def defined_tests(pattern: str = "**/*.py") -> set[str]:
    """The test functions of the files under tests/ that ``pattern`` matches."""
    defined = set()
    for path in (ROOT / "tests").glob(pattern):
        defined |= set(re.findall(r"^\s*def (test_\w+)", path.read_text(), re.M))
    return defined


def named_tests_with_their_file(text: str) -> list[tuple[str | None, str]]:
    """Each backquoted test name of ``text`` with the test file named last before it (directly, or by a
    letter the document gave that file), or None before any file is named."""
    legends = dict((letter, path) for path, letter in re.findall(_TEST_FILE + r"\s*\(([A-Z])\)", text))
    named, current = [], None
    for match in re.finditer("|".join((_TEST_FILE, _LEGEND_USE, _TEST_NAME)), text):
        path, letter, name = match.groups()
        if path is not None:
            current = path
        elif letter is not None:
            current = legends.get(letter, current)
        else:
            named.append((current, name))
    return named


def test_every_test_and_file_the_documents_name_exists():
    """A claim that names its test (``test_...``) or a file (``src/...``, ``tests/...``) names one there is,
    and a test named after its file (``tests/x.py`` (``test_a``, ``test_b``), or by the file's letter) is in
    that file: when a test or a module is renamed or moved, the documents follow."""
    defined = defined_tests()
    missing = []
    for document in DOCUMENTS:
        text = document.read_text()
        for name in set(re.findall(r"`(test_\w+)`", text)) | set(re.findall(r"[ (]`?(test_\w+)`?[,)]", text)):
            if name not in defined:
                missing.append(f"{document.relative_to(ROOT)}: {name}")
        for path, name in named_tests_with_their_file(text):
            if path is not None and name in defined and name not in defined_tests(path.removeprefix("tests/")):
                missing.append(f"{document.relative_to(ROOT)}: {name} is not in {path}")
        for path in set(re.findall(r"`((?:src|tests|docs)/[\w./*-]+)", text)):
            if not list(ROOT.glob(path.split("::")[0])):
                missing.append(f"{document.relative_to(ROOT)}: {path}")
    assert not missing, missing


# -- Python examples -----------------------------------------------------------------------------------


def _edgefuse_examples() -> list[tuple[str, str]]:
    return [
        (f"{path.relative_to(ROOT)}#{number}", code)
        for path in DOCUMENTS
        for number, code in enumerate(python_examples(path), 1)
        if re.search(r"^\s*(from|import) edgefuse\b", code, re.M)
    ]


#: The optional flows' packages an example may import, and the skip that names their install.
OPTIONAL_IMPORTS = {"optimum": require_optimum}


def run_imports(where: str, tree: ast.Module) -> dict:
    """Run the example's import statements alone, in a namespace of their own; an example that imports an
    optional flow's package skips where that package is absent, naming its install."""
    namespace: dict = {}
    for statement in ast.walk(tree):
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in statement.names] if isinstance(statement, ast.Import) else [statement.module or ""]
            for module in modules:
                OPTIONAL_IMPORTS.get(module.split(".")[0], lambda: None)()
            exec(compile(ast.Module([statement], []), where, "exec"), namespace)
    return namespace


@pytest.mark.parametrize("where, code", _edgefuse_examples(), ids=[where for where, _ in _edgefuse_examples()])
def test_every_python_example_imports_what_it_uses(where, code):
    """The example's imports run, and each attribute chain from an imported edgefuse name resolves."""
    tree = ast.parse(code)
    namespace = run_imports(where, tree)
    unresolved = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain, root = [node.attr], node.value
        while isinstance(root, ast.Attribute):
            chain.insert(0, root.attr)
            root = root.value
        if not isinstance(root, ast.Name) or root.id not in namespace:
            continue  # a name the example makes itself
        origin = getattr(namespace[root.id], "__module__", None) or getattr(namespace[root.id], "__name__", "")
        if not str(origin).startswith(EDGEFUSE):
            continue
        found = namespace[root.id]
        for attribute in chain:
            if not hasattr(found, attribute):
                unresolved.append(".".join([root.id, *chain]))
                break
            found = getattr(found, attribute)
    assert not unresolved, f"{where}: {unresolved}"


def imported_edgefuse_names(code: str) -> list[tuple[str, str]]:
    """(module, name) for each name an example takes from edgefuse: ``from M import N``, and
    ``edgefuse.N`` or ``edgefuse.P.N`` reached from ``import edgefuse`` or ``import edgefuse.P``; a
    package the example imports whole (``import edgefuse.xnnpack``) is a module, not a name."""
    tree = ast.parse(code)
    names, packages = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == EDGEFUSE:
            names += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            packages |= {alias.name for alias in node.names if alias.name.split(".")[0] == EDGEFUSE}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (dotted := ast.unparse(node.value)) in packages:
            if f"{dotted}.{node.attr}" not in packages:  # edgefuse.qnn after import edgefuse.qnn: a package
                names.append((dotted, node.attr))
    return names


@pytest.mark.parametrize("where, code", _edgefuse_examples(), ids=[where for where, _ in _edgefuse_examples()])
def test_every_name_a_python_example_imports_is_public(where, code):
    """An example takes from edgefuse only public names (a package's ``__all__``, one level under
    ``edgefuse``), and imports whole only ``edgefuse`` and its packages: what a reader copies keeps working
    when a module inside a package moves."""
    from tests.public_names import public

    tree = ast.parse(code)
    deep = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
            if alias.name.split(".")[0] == EDGEFUSE and alias.name.count(".") > 1]
    private = [f"{module}.{name}" for module, name in imported_edgefuse_names(code) if not public(module, name)]
    assert not deep + private, f"{where}: not public: {deep + private}"


#: Where an example's literal argument must be one of a known list: the function (module and name), the
#: parameter, and the list's dotted name.
KNOWN_VALUES = {
    ("edgefuse.inputs.models.build_model", "name"): "edgefuse.inputs.models.MODEL_NAMES",
    ("edgefuse.inputs.qnn_models.build_qnn_model", "name"): "edgefuse.inputs.qnn_models.QNN_MODEL_NAMES",
    ("edgefuse.qnn.pipeline.lower", "precision"): "edgefuse.qnn.pipeline.LOWER_PRECISIONS",
    ("edgefuse.xnnpack.quantizer.quantize", "scheme"): "edgefuse.xnnpack.quantizer.SCHEMES",
}

#: What an example passes that is not a literal (a model, its inputs, a program): binding needs only a value.
PLACEHOLDER = object()


def _called(function: ast.expr, namespace: dict):
    """The object a call's function names, reached from the example's imports, or None (a name the
    example makes itself, such as ``lowered.to_executorch``)."""
    if isinstance(function, ast.Name):
        return namespace.get(function.id)
    if isinstance(function, ast.Attribute):
        owner = _called(function.value, namespace)
        return getattr(owner, function.attr, None) if owner is not None else None
    return None


def _argument(node: ast.expr):
    return node.value if isinstance(node, ast.Constant) else PLACEHOLDER


def edgefuse_calls(where: str, code: str) -> tuple[list[str], list[str]]:
    """Each call of an edgefuse function or class in the example, bound to its signature as written
    without running it (non-literal arguments as :data:`PLACEHOLDER`): the calls that bind, and what is
    wrong (a renamed keyword, a missing argument, a literal outside its :data:`KNOWN_VALUES`)."""
    import inspect

    tree = ast.parse(code)
    namespace = run_imports(where, tree)
    checked, wrong = [], []
    for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
        called = _called(call.func, namespace)
        if not str(getattr(called, "__module__", "")).startswith(EDGEFUSE):
            continue
        text = ast.unparse(call)
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            wrong.append(f"{text}: unpacked arguments cannot be checked")
            continue
        try:
            bound = inspect.signature(called).bind(
                *map(_argument, call.args), **{k.arg: _argument(k.value) for k in call.keywords}
            )
        except TypeError as error:
            wrong.append(f"{text}: {error}")
            continue
        checked.append(f"{called.__module__}.{called.__qualname__}")
        for parameter, value in bound.arguments.items():
            known = KNOWN_VALUES.get((checked[-1], parameter))
            if known is not None and value is not PLACEHOLDER and value not in resolve(known):
                wrong.append(f"{text}: {parameter}={value!r} is not one of {resolve(known)}")
    return checked, wrong


@pytest.mark.parametrize("where, code", _edgefuse_examples(), ids=[where for where, _ in _edgefuse_examples()])
def test_every_edgefuse_call_of_a_python_example_binds_to_its_signature(where, code):
    """A renamed keyword, a missing argument or a model name, precision or quantizer scheme edgefuse does
    not have fails here, without running the example."""
    _, wrong = edgefuse_calls(where, code)
    assert not wrong, f"{where}: {wrong}"


def test_the_signature_check_reaches_the_readme_calls():
    """The check above finds the calls the README makes (one that found none would pass every example)."""
    checked = {name for number, code in enumerate(python_examples(README), 1)
               for name in edgefuse_calls(f"README.md#{number}", code)[0]}
    assert {name for name, _ in KNOWN_VALUES} | {"edgefuse.core.recompose.recompose_rms_norm"} <= checked, checked


@pytest.mark.slow
def test_the_readme_core_example_runs():
    """The README's first example as a reader runs it (export and an edge program of tiny Qwen3, no
    lowering): the captured graph's norms are rebuilt."""
    namespace: dict = {}
    exec(compile(python_examples(README)[0], "README.md#1", "exec"), namespace)
    assert any(decision.rebuilt for decision in namespace["result"].decisions)


# -- commands ----------------------------------------------------------------------------------------------


def test_the_readme_shows_commands_in_code_blocks_and_tables():
    """The parsing below finds the README's commands (a README without them would pass every test)."""
    blocks, tables = readme_block_commands(), readme_table_commands()
    assert {c.path for c in blocks} >= {("demo",), ("export-llm",), ("report",), ("lower",)}, blocks
    assert len(tables) >= 15, tables


@pytest.mark.parametrize("found", readme_block_commands() + readme_table_commands(), ids=lambda c: c.text)
def test_every_readme_command_exists_and_takes_the_options_it_names(found, capsys):
    """The options the line names are ones its ``--help`` lists (not words of its prose), and an
    ``edgefuse`` line parses as written: its values are ones the options take."""
    text = help_text(found, capsys)
    unknown = [option for option in found.options if option not in options_in_help(text)]
    assert not unknown, f"{found.text}: {unknown} not options of {' '.join([found.program, *found.path])}"
    if found.program == EDGEFUSE:
        from edgefuse import cli

        try:
            cli.build_parser().parse_args(list(found.words))
        except SystemExit:
            pytest.fail(f"{found.text}: edgefuse does not parse it: {capsys.readouterr().err}")


def every_command() -> list[Command]:
    """Every command edgefuse has: each ``edgefuse`` command (the table of :mod:`edgefuse.cli`), and each
    ``python -m`` program of ``edgefuse.tools`` and ``edgefuse.fuzz`` that takes arguments (a module that
    runs its ``main(argv)`` under ``if __name__ == "__main__"``)."""
    import inspect
    import pkgutil

    import edgefuse.fuzz
    import edgefuse.tools
    from edgefuse import cli

    paths = [name.split() for name in cli.COMMANDS]  # the table names each command, "qnn setup" included
    found = [Command(" ".join([EDGEFUSE, *path]), EDGEFUSE, tuple(path)) for path in paths]
    for package in (edgefuse.tools, edgefuse.fuzz):
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
            if info.name == "__main__":
                continue  # importing it runs the package's program
            module = resolve(f"{package.__name__}.{info.name}")
            main = getattr(module, "main", None)
            runs_as_program = 'if __name__ == "__main__":' in inspect.getsource(module)
            if main is not None and runs_as_program and "argv" in inspect.signature(main).parameters:
                found.append(Command(f"{PYTHON_M}{module.__name__}", module.__name__, ()))
    return found


@pytest.mark.parametrize("found", every_command(), ids=lambda c: c.text)
def test_the_command_guide_names_every_option_of_every_command(found, capsys):
    """docs/commands.md is the reference: an option a command gains is written there."""
    guide = (ROOT / "docs" / "commands.md").read_text()
    assert found.text in guide, f"docs/commands.md does not name {found.text}"
    missing = sorted(option for option in options_in_help(help_text(found, capsys)) if not named_in(option, guide))
    assert not missing, f"docs/commands.md does not name {found.text}'s {missing}"


def _shipped_config(name: str) -> Path:
    import executorch

    return Path(executorch.__path__[0]) / "examples" / "models" / "llama" / "config" / name


def _export_llm_example() -> Command:
    [found] = [c for c in readme_block_commands() if c.path == ("export-llm",)]
    return found


def test_the_export_llm_example_composes_with_executorch_shipped_config():
    """The README's export-llm line, with ExecuTorch's own ``llama_xnnpack.yaml``: edgefuse's check takes
    its config and overrides, and hydra composes them as export_llm does (a key the config lacks needs
    ``+``; without it hydra refuses with "Key 'params' is not in struct")."""
    from hydra import compose, initialize_config_dir

    from edgefuse.llm.config_check import check_command_line

    found = _export_llm_example()
    config = found.words[found.words.index("--config") + 1]
    shipped = _shipped_config(config)
    arguments = [word if word != config else str(shipped) for word in found.words[1:] if word != "--compare"]
    check_command_line(arguments)
    with initialize_config_dir(config_dir=str(shipped.parent), version_base=None):
        composed = compose(config_name=shipped.stem, overrides=found.overrides)
    for override in found.overrides:
        key, value = override.lstrip("+").split("=", 1)
        section, name = key.split(".")
        assert str(composed[section][name]) == value, override


@pytest.mark.slow
def test_the_export_llm_example_runs_with_executorch_shipped_config(tmp_path, monkeypatch, capsys):
    """The README's export-llm line run whole (two exports) on small params and a random checkpoint written
    where the line names them, with ExecuTorch's ``llama_xnnpack.yaml`` beside them: ``export-llm --compare``
    through the command line. Both programs side by side, stock leaving each norm's mean outside the
    delegate and edgefuse none; the two ``.pte`` files and hydra's record and job log beside them (stock's
    record went with its staging folder), no other file changed, and nothing left swapped."""
    from edgefuse import cli
    from edgefuse.llm.eager import write_small_model
    from edgefuse.llm.lowering import swapped
    from edgefuse.llm.small import SMALL_LLAMA
    from tests.harness import side_by_side_counts
    from tests.llm.test_config_check import snapshot

    found = _export_llm_example()
    config = found.words[found.words.index("--config") + 1]
    shutil.copy(_shipped_config(config), tmp_path / config)
    write_small_model(str(tmp_path), SMALL_LLAMA)
    overrides = dict(o.lstrip("+").split("=", 1) for o in found.overrides)
    assert (overrides["base.params"], overrides["base.checkpoint"]) == ("params.json", "checkpoint.pth")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code = cli.main(["-q", *found.words])
    out, err = capsys.readouterr()
    assert code == 0, err
    name = overrides["export.output_name"]
    stock_name = name.replace(".pte", ".stock.pte")
    assert (tmp_path / name).is_file() and (tmp_path / stock_name).is_file()
    changed = {path for path, digest in snapshot(tmp_path).items() if before.get(path) != digest}
    assert changed == {str(tmp_path / written) for written in (
        name, stock_name, ".hydra", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml",
        "export_llm.log")}
    lines = out.splitlines()
    assert lines[0].startswith("edgefuse lowering: "), lines[:3]  # export_llm's own output went to stderr
    assert len(lines) < 40, len(lines)
    header = next(line for line in lines if line.lstrip().startswith("stock ("))
    assert "edgefuse (" in header and header.index("stock (") < header.index("edgefuse (")
    stock_means, our_means = side_by_side_counts(out)["aten::mean.out"]
    assert stock_means == 3 and our_means == 0, out  # two norms in the layer and the final norm
    assert lines[-1] == f"wrote {name} and {stock_name}"
    assert not any(swapped().values())


def _runnable_block_commands() -> list[Command]:
    return [c for c in readme_block_commands() if c.text not in NOT_RUN_WHOLE and c.path != ("export-llm",)]


def test_each_readme_command_not_run_whole_says_why():
    shown = {c.text for c in readme_block_commands()}
    assert set(NOT_RUN_WHOLE) <= shown, set(NOT_RUN_WHOLE) - shown


@pytest.mark.slow
@pytest.mark.parametrize("found", _runnable_block_commands(), ids=lambda c: c.text)
def test_the_readme_command_runs_whole(found, tmp_path, monkeypatch, capsys):
    """The command as the README writes it, in a fresh folder: exit 0 and no file written (report: seconds)."""
    from edgefuse import cli

    monkeypatch.chdir(tmp_path)
    assert found.program == EDGEFUSE, found.text
    code = cli.main(["-q", *found.words])
    assert code == 0, capsys.readouterr().err
    assert os.listdir(tmp_path) == []
