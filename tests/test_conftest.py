"""tests/conftest.py sends the files that share a costly session fixture to one worker, a group per fixture
group, and refuses a file that would tie two groups together."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import _shared_groups


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
