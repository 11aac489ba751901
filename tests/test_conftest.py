"""tests/conftest.py sends the files that share a costly session fixture to one worker, a group per fixture
group, and refuses a file that would tie two groups together; it sends the groups longest first by the
seconds recorded with ``--store-durations``; it freezes what the collection made out of the cycle
collector's reach."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import GC_THRESHOLDS, _longest_groups_first, _plain_id, _shared_groups


def _item(path: str, *fixtures: str) -> SimpleNamespace:
    """What the grouping reads of a collected test: its file and the fixtures it uses."""
    return SimpleNamespace(path=Path(path), fixturenames=["tmp_path", *fixtures])


def test_the_files_that_share_a_fixture_are_one_group_and_the_others_keep_their_own():
    items = [
        _item("tests/inputs/test_models.py", "tiny_program"),
        _item("tests/inputs/test_models.py"),
        _item("tests/core/test_decisions_unchanged.py", "tiny_program"),
        _item("tests/qnn/test_pipeline.py", "lowered_rms_norm"),
        _item("tests/qnn/test_emulator.py", "lowered_rms_norm_16a8w"),
        _item("tests/core/test_forms.py"),
    ]
    assert _shared_groups(items) == {
        Path("tests/inputs/test_models.py"): "shared-tiny-programs",
        Path("tests/core/test_decisions_unchanged.py"): "shared-tiny-programs",
        Path("tests/qnn/test_pipeline.py"): "shared-qnn-programs",
        Path("tests/qnn/test_emulator.py"): "shared-qnn-programs",
    }


def test_a_file_using_fixtures_of_two_groups_is_refused():
    items = [_item("tests/core/test_both.py", "tiny_program"), _item("tests/core/test_both.py", "lowered_rms_norm")]
    with pytest.raises(pytest.UsageError, match="shared-qnn-programs.*shared-tiny-programs"):
        _shared_groups(items)


class _Collected:
    """What the ordering reads of a collected test: its node id (with xdist's ``@group``), group and slow mark."""

    def __init__(self, nodeid: str, group: str, slow: bool = False):
        self.nodeid, self.group, self.slow = f"{nodeid}@{group}", group, slow

    def get_closest_marker(self, name: str):
        if name == "xdist_group":
            return SimpleNamespace(args=(self.group,))
        return SimpleNamespace(args=()) if name == "slow" and self.slow else None


def test_the_groups_are_sent_longest_first_by_the_recorded_seconds_of_their_selected_tests():
    many_short = [_Collected(f"tests/core/test_a.py::t{i}", "a") for i in range(5)]
    one_long = _Collected("tests/cli/test_b.py::t", "b")
    unknown_slow = _Collected("tests/qnn/test_c.py::t", "c", slow=True)
    unknown_fast = _Collected("tests/core/test_d.py::t", "d")
    seconds = {f"tests/core/test_a.py::t{i}": 0.5 for i in range(5)} | {"tests/cli/test_b.py::t": 30.0}
    items = [*many_short[:2], unknown_fast, one_long, *many_short[2:], unknown_slow]
    ordered = _longest_groups_first(items, seconds)
    # b (30 s recorded), c (slow, not recorded: 10 s), a (5 x 0.5 s), d (fast, not recorded: 0.2 s)
    assert [item.group for item in ordered] == ["b", "c", *"aaaaa", "d"]
    assert [item.nodeid for item in ordered if item.group == "a"] == [item.nodeid for item in many_short]


def test_a_node_id_is_read_without_the_group_xdist_appends():
    assert _plain_id("tests/core/test_a.py::t[x@y]@tests/core/test_a.py") == "tests/core/test_a.py::t[x@y]"
    assert _plain_id("tests/core/test_a.py::t[x@y]") == "tests/core/test_a.py::t[x@y]"
    assert _plain_id("tests/core/test_a.py::t@shared-tiny-programs") == "tests/core/test_a.py::t"


def test_store_durations_adds_up_each_tests_phases_and_keeps_what_the_file_held(tmp_path, monkeypatch):
    import tests.conftest as conftest

    monkeypatch.setattr(conftest, "DURATIONS", tmp_path / "durations.json")
    conftest.DURATIONS.write_text('{"tests/x.py::kept": 3.0, "tests/x.py::t": 9.0}')
    config = SimpleNamespace(getoption=lambda name: name == "store_durations")
    order = conftest._Order(config)
    for duration in (0.25, 1.5, 0.25):  # setup, call, teardown
        order.pytest_runtest_logreport(SimpleNamespace(nodeid="tests/x.py::t@tests/x.py", duration=duration))
    order.pytest_sessionfinish()
    assert json.loads(conftest.DURATIONS.read_text()) == {"tests/x.py::kept": 3.0, "tests/x.py::t": 2.0}
    # a worker of xdist sends its reports to the controller and writes nothing
    conftest.DURATIONS.write_text("{}")
    config.workerinput = {}
    order.pytest_sessionfinish()
    assert conftest.DURATIONS.read_text() == "{}"


def test_the_objects_the_collection_made_are_out_of_the_collectors_reach():
    # the conftest's own functions were made as the collection imported it, this file's as it collected it
    tracked = {id(o) for o in gc.get_objects()}
    assert gc.get_freeze_count() > 0 and id(_longest_groups_first) not in tracked
    assert id(test_store_durations_adds_up_each_tests_phases_and_keeps_what_the_file_held) not in tracked


def test_the_collector_runs_at_the_conftests_thresholds():
    assert gc.get_threshold() == GC_THRESHOLDS != (700, 10, 10)
