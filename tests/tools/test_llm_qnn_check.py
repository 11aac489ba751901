"""``python -m edgefuse.tools.llm_qnn_check``: a mask or a calibration it cannot use is an error naming the
option, before any work."""

from __future__ import annotations

import pytest

from edgefuse.tools.llm_qnn_check import main


@pytest.mark.parametrize("argv, message", [
    (["--mask", "3"], "--mask is a negative float16 value"),
    (["--mask=-1e6"], "--mask is a negative float16 value"),
    (["--mask", "nan"], "--mask is a negative float16 value"),
    (["--calibration", "-1"], "--calibration from 0 to 128 calls"),
    (["--calibration", "129"], "--calibration from 0 to 128 calls"),
])
def test_each_bad_option_names_itself(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
