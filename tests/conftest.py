"""Marks each test with its layer, the folder it lives in, so one layer runs alone; keeps the ``slow``
marker true.

``python -m pytest -m core`` (or ``python -m pytest tests/core``) runs the rewriting core's tests alone, and
``python -m pytest -m rules`` only its numbered rules' tests (``tests/core/test_rule*.py``, well under a minute);
the other layers are ``runtime``, ``quant``, ``xnnpack``, ``qnn``, ``llm``, ``hf``, ``inputs``, ``compare``, ``console``, ``tools``,
``cli`` and ``fuzz``. ``tests`` is a package, so the shared helpers are imported by their full name
(``from tests.harness import ...``) wherever a test file lives; pytest puts the repository root on ``sys.path``
for it.

``slow`` marks the tests that lower a program (to a backend or to a ``.pte``), run a ``.pte`` (QNN's
emulator included), export an LLM (which lowers) or start the edgefuse command in a new process;
``python -m pytest -m "not slow"`` is the fast tier. While a test without the marker runs, those entry
points raise `SlowCall`, and the test fails naming the call even when the code under test catches it.

With several workers (``-n``, ``--dist loadgroup``), the tests of one file run on one worker, so that a
module fixture is built once, and the files that share a costly session fixture (:data:`SHARED_FIXTURES`:
programs lowered for QNN, the built-in tiny models exported, the small Llama's float32 pair of
``export_llm``) run on the same worker. The groups are sent
longest first, by the seconds their selected tests took in the run that wrote ``tests/durations.json``
(``--store-durations``): a long group sent last would set the wall time alone. torch.export's list of
CompositeImplicitAutograd ops, which it rebuilds from the dispatcher on every ``to_edge`` (a third of the
call), is kept for the session, keyed by the registered ops (:func:`edgefuse.fuzz.edge_programs.cached_cia_ops`).
What the collection made, torch's, ExecuTorch's and the test modules' objects, is frozen out of the cycle
collector's reach once collected: every full collection would walk it again and free nothing. The collector
then runs after 50,000 new container objects instead of Python's 700 (:data:`GC_THRESHOLDS`): tracing and
lowering graphs make containers by the hundred thousand, and each young collection walked the graphs still
in use again. Every FX graph is a reference cycle, so a graph that reaches the oldest generation stays
until an explicit ``gc.collect()``. What that costs was measured on whole runs of a fresh clone: each worker's
peak resident memory 1.75 and 1.75 GB with these thresholds, 1.73 and 1.67 GB with Python's.
"""

from __future__ import annotations

import collections
import functools
import gc
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.mark.structures import ParameterSet

LAYERS = ("core", "runtime", "quant", "xnnpack", "qnn", "llm", "hf", "inputs", "compare", "console", "tools", "cli", "fuzz")

_HERE = Path(__file__).parent


#: Session fixtures several test files share, by the group of files that share them: the files that use one
#: run on one worker, which builds it once. The programs lowered for QNN; the built-in tiny models exported;
#: the small Llama exported in float32 by ``export_llm``, stock and with edgefuse.
SHARED_FIXTURES = {
    "lowered_rms_norm": "shared-qnn-programs",
    "lowered_rms_norm_16a8w": "shared-qnn-programs",
    "tiny_program": "shared-tiny-programs",
    "llama_fp32_programs": "shared-llama-fp32",
}


def _shared_groups(items: list[pytest.Item]) -> dict[Path, str]:
    """The group of each file that uses a fixture of :data:`SHARED_FIXTURES`; a file using fixtures of two
    groups would split one of them across workers, and is refused."""
    groups: dict[Path, set[str]] = collections.defaultdict(set)
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            if name in SHARED_FIXTURES:
                groups[item.path].add(SHARED_FIXTURES[name])
    for path, names in groups.items():
        if len(names) > 1:
            raise pytest.UsageError(f"{path} uses session fixtures of the groups {sorted(names)}: one file, one group")
    return {path: names.pop() for path, names in groups.items()}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    sharing = _shared_groups(items)
    for item in items:
        parts = Path(item.path).relative_to(_HERE).parts
        if len(parts) > 1 and parts[0] in LAYERS:
            item.add_marker(getattr(pytest.mark, parts[0]))
        if parts[0] == "core" and parts[-1].startswith("test_rule"):
            item.add_marker(pytest.mark.rules)
        # --dist loadgroup: a file's tests run on one worker, so its module fixtures are built once
        item.add_marker(pytest.mark.xdist_group(sharing.get(item.path, "/".join(parts))))


def _group(item: pytest.Item) -> str:
    return item.get_closest_marker("xdist_group").args[0]


#: Each test's seconds (setup, call and teardown, by node id) in the runs made with ``--store-durations``.
DURATIONS = _HERE / "durations.json"
#: The seconds expected of a test the file does not hold, slow or not: about the median of each kind.
UNKNOWN_SECONDS = {True: 10.0, False: 0.2}


def _plain_id(nodeid: str) -> str:
    """A node id without the ``@group`` that ``--dist loadgroup`` appends to it."""
    return re.sub(r"@[^@\[\]]*$", "", nodeid)


def _longest_groups_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """The items with each group's tests together, the groups the longest first by the recorded seconds
    of their tests (ties in collection order): the order in which ``--dist loadgroup`` sends them."""
    expected: collections.Counter = collections.Counter()
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        expected[_group(item)] += seconds.get(_plain_id(item.nodeid), UNKNOWN_SECONDS[slow])
    first = {group: at for at, group in reversed(list(enumerate(map(_group, items))))}
    return sorted(items, key=lambda item: (-expected[_group(item)], first[_group(item)]))


def _recorded() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


class _Order:
    """Orders the selected tests longest group first, after ``-m`` and ``-k`` have deselected, and with
    ``--store-durations`` adds up each test's seconds and writes them to :data:`DURATIONS` at the end."""

    def __init__(self, config: pytest.Config):
        self.config, self.seconds = config, collections.Counter()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items[:] = _longest_groups_first(items, _recorded())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_plain_id(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        if self.config.getoption("store_durations") and not hasattr(self.config, "workerinput"):
            merged = {**_recorded(), **{nodeid: round(s, 2) for nodeid, s in self.seconds.items()}}
            DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true",
                     help="write each test's seconds to tests/durations.json (merged with what it holds), by "
                          "which the next runs send the longest groups of tests first")


def pytest_configure(config: pytest.Config) -> None:
    """Keep the order :func:`_longest_groups_first` gives: xdist would otherwise reorder the groups by
    their number of tests alone."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    config.pluginmanager.register(_Order(config), "edgefuse-test-order")


#: The cycle collector's thresholds for the tests' processes (``gc.set_threshold``): a youngest-generation
#: collection after 50,000 new container objects, not Python's 700; a middle one after 20 of those (Python:
#: 10) and an oldest one after 100 middle ones (Python: 10), so full collections almost never run unasked. Measured on tests/core and tests/fuzz's fast tests (-n0, three alternating pairs): 128 CPU-s
#: on average with Python's thresholds, 110 with these.
GC_THRESHOLDS = (50_000, 20, 100)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the objects the collection made (``gc.freeze``): torch's, ExecuTorch's and the test modules'
    live as long as the process, and each full collection, Python's own and every ``gc.collect()``, walked
    them all again (over 400,000) to free none. The garbage among them is collected first. Then collect
    less often (:data:`GC_THRESHOLDS`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class SlowCall(AssertionError):
    """A test without the ``slow`` marker reached an entry point of the slow tier."""


#: The test running now, and the slow calls it made without the marker (read when its report is made).
_running: pytest.Item | None = None
SLOW_CALLS: list[str] = []


def _check(what: str) -> None:
    if _running is not None and _running.get_closest_marker("slow") is None:
        SLOW_CALLS.append(what)
        raise SlowCall(f"{_running.nodeid} {what} and has no slow marker")


def _guarded(original, what: str):
    @functools.wraps(original)
    def call(*args, **kwargs):
        _check(what)
        return original(*args, **kwargs)

    return call


def _starts_edgefuse(args) -> bool:
    """Whether a new process's command line is the edgefuse command or one of its ``python -m`` modules."""
    argv = [str(arg) for arg in ([args] if isinstance(args, (str, Path)) else args)]
    if argv and Path(argv[0].split()[0]).name == "edgefuse":
        return True
    return any(flag == "-m" and module.split(".")[0] == "edgefuse" for flag, module in zip(argv, argv[1:]))


def _guard_spawn(original):
    @functools.wraps(original)
    def init(self, args, *rest, **kwargs):
        if _starts_edgefuse(args):
            _check("starts the edgefuse command in a new process")
        return original(self, args, *rest, **kwargs)

    return init


def _entry_points() -> list[tuple[object, str, str]]:
    """The entry points of the slow tier: (owner, attribute, what a call does). ExecuTorch's lowering is
    caught as it starts partitioning (both of ``to_backend``'s paths over partitioners), and when a
    lowered module is made by any other path."""
    from executorch.exir.backend import backend_api
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    from executorch.exir.program._program import EdgeProgramManager
    from executorch.runtime import Runtime

    return [
        (backend_api, "_partition_and_lower", "lowers a program to a backend"),
        (backend_api, "lower_all_submodules_to_backend", "lowers a program to a backend"),
        (LoweredBackendModule, "__init__", "lowers a program to a backend"),
        (EdgeProgramManager, "to_executorch", "makes a .pte program"),
        (Runtime, "load_program", "loads a .pte in the runtime"),
    ]


@pytest.fixture(scope="session", autouse=True)
def _slow_entry_points_guarded():
    """The slow tier's entry points wrapped by `_check` for the session."""
    saved = []
    for owner, name, what in _entry_points():
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, _guarded(getattr(owner, name), what))
    saved.append((subprocess.Popen, "__init__", subprocess.Popen.__init__))
    subprocess.Popen.__init__ = _guard_spawn(subprocess.Popen.__init__)
    yield
    for owner, name, original in reversed(saved):
        setattr(owner, name, original)


@pytest.fixture(scope="session")
def tiny_program():
    """``tiny_program(name, dtype)``: a built-in tiny model (:func:`edgefuse.inputs.models.build_model`, its
    default size), its inputs and its ``torch.export`` program, each built and exported once for the session
    and read, never changed, by the files that share it (:data:`SHARED_FIXTURES`)."""
    import torch
    from torch.export import export

    from edgefuse.inputs.models import build_model

    @functools.cache
    def exported(name: str, dtype: torch.dtype):
        module, inputs = build_model(name, dtype=dtype)
        return module, inputs, export(module, inputs)

    def tiny_program(name: str, dtype: torch.dtype = torch.float32):
        return exported(name, dtype)

    return tiny_program


@pytest.fixture(scope="session")
def llama_fp32_programs(tmp_path_factory):
    """``python -m edgefuse.tools.llm_latency --export-only`` of its smallest Llama (64x1, the small Llama of
    ``llm_check``) in float32, run once for the session: the folder, the exit code and stdout. Its two
    programs, ``64x1/fp32/stock.pte`` and ``64x1/fp32/edgefuse.pte`` beside the model's ``params.json`` and
    ``checkpoint.pth``, are what the tests that read or time an ``export_llm`` pair of that model use."""
    import contextlib
    import io

    from edgefuse.tools import llm_latency

    folder = tmp_path_factory.mktemp("latency") / "programs"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = llm_latency.main(["-q", "--export-only", "--dir", str(folder), "--sizes", "64x1", "--dtypes", "fp32",
                                 "--prefill", "8", "--decode", "4"])
    return folder, code, out.getvalue()


@pytest.fixture(scope="session", autouse=True)
def _cia_ops_cached():
    """torch.export's list of CompositeImplicitAutograd ops, read once per set of registered ops, for the
    session (:func:`edgefuse.fuzz.edge_programs.cached_cia_ops`)."""
    from edgefuse.fuzz.edge_programs import cached_cia_ops

    with cached_cia_ops():
        yield


#: The modes each case of a test parametrized by ``mode`` is collected in, by the case's other parameters
#: (read through :func:`case_modes` by tests/harness.py).
_MODES_OF_CASE: dict[tuple, set[str]] = collections.defaultdict(set)


def _case(item: pytest.Item) -> tuple | None:
    """A case's key: its test and its parameters other than ``mode``, or only those a ``dim_order_case``
    marker names (a design that runs each value of those in every mode, each time with other values)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "mode" not in params:
        return None
    marker = item.get_closest_marker("dim_order_case")
    names = set(marker.args) if marker else set(params) - {"mode"}
    return item.path, item.originalname, tuple(sorted((name, repr(params[name])) for name in names))


def pytest_itemcollected(item: pytest.Item) -> None:
    if (case := _case(item)) is not None:
        _MODES_OF_CASE[case].add(item.callspec.params["mode"])


def _declared_modes(item: pytest.Item) -> set[str] | None:
    """The values of the item's ``parametrize`` marker whose only parameter is ``mode``, whichever of its
    items are collected (a run of one item by its node id collects that mode alone); ``None`` without one."""
    for marker in item.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs["argnames"]
        values = marker.args[1] if len(marker.args) > 1 else marker.kwargs["argvalues"]
        names = [name.strip() for name in names.split(",")] if isinstance(names, str) else list(names)
        if names == ["mode"]:
            return {value.values[0] if isinstance(value, ParameterSet) else value for value in values}
    return None


def case_modes() -> set[str] | None:
    """The modes the running test's case runs in, ``None`` for a test not parametrized by ``mode``: those
    its ``mode`` marker names, or, for ``mode`` among other parameters of one marker, those collected."""
    case = None if _running is None else _case(_running)
    if case is None:
        return None
    declared = _declared_modes(_running)
    return _MODES_OF_CASE[case] if declared is None else declared


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    global _running
    _running = item
    try:
        return (yield)
    finally:
        _running = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    if SLOW_CALLS and report.when in ("setup", "call"):
        calls, SLOW_CALLS[:] = "; ".join(dict.fromkeys(SLOW_CALLS)), []
        message = f"{item.nodeid} {calls} and has no slow marker (tests/conftest.py)"
        if report.failed:
            report.sections.append(("slow calls", message))
        else:
            report.outcome = "failed"
            report.longrepr = message
    return report
