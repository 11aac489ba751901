"""The QNN sweep's command line and the precisions it measures: an unknown precision exits 2 before any
work, and the precisions ``lower`` takes are names edgefuse knows."""

from __future__ import annotations

import os

import pytest

from edgefuse.core.profiles import FLOAT, QUANTIZED_PRECISIONS
from edgefuse.tools import qnn_sweep


def test_an_unknown_precision_exits_2_with_the_choices_and_writes_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        qnn_sweep.main(["confirm", "--out", str(tmp_path), "--precision", "4a4w"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "invalid choice: '4a4w'" in err and "16a4w" in err
    assert "Traceback" not in err and os.listdir(tmp_path) == []


def test_the_precisions_lower_takes_are_names_edgefuse_knows():
    from edgefuse.qnn.precisions import LOWER_PRECISIONS, LOWER_QUANT_DTYPES

    assert LOWER_PRECISIONS[0] == FLOAT and set(LOWER_PRECISIONS[1:]) <= set(QUANTIZED_PRECISIONS)
    assert set(LOWER_QUANT_DTYPES) == set(LOWER_PRECISIONS[1:])
