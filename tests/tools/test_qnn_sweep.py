"""The QNN sweep's command line and the precisions it measures: an unknown precision exits 2 before any
work, and the quantized precisions edgefuse names are the released quantizer's."""

from __future__ import annotations

import os

import pytest

from edgefuse.core.profiles import QUANTIZED_PRECISIONS
from edgefuse.tools import qnn_sweep


def test_an_unknown_precision_exits_2_with_the_choices_and_writes_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        qnn_sweep.main(["confirm", "--out", str(tmp_path), "--precision", "4a4w"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "invalid choice: '4a4w'" in err and "16a4w" in err
    assert "Traceback" not in err and os.listdir(tmp_path) == []


def test_the_quantized_precisions_are_the_released_quant_dtypes():
    from edgefuse.qnn.quantizer import QUANT_DTYPES  # held to the release in tests/tools/test_quant.py

    assert QUANTIZED_PRECISIONS == tuple(name.removeprefix("use_") for name in QUANT_DTYPES)
