"""A SoC QNN does not compile float16 RmsNorm for is refused at --precision fp16 before any lowering:
exit 2 with the reason, no file written; a quantized precision for it is accepted."""

from __future__ import annotations

import textwrap

import pytest

from edgefuse import cli
from edgefuse.cli.commands import qnn_options
from edgefuse.inputs.errors import USAGE, UsageError

MODEL = textwrap.dedent(
    '''
    import torch
    from torch import nn


    def norm():
        return nn.RMSNorm(32), (torch.randn(2, 16, 32),)
    '''
)


def test_lowering_for_a_soc_without_float16_exits_2_with_the_reason(tmp_path, capsys):
    path = tmp_path / "models.py"
    path.write_text(MODEL)
    out = tmp_path / "out.pte"
    argv = ["lower", f"{path}:norm", "-o", str(out), "--backend", "qnn", "--soc", "SM8350", "--precision", "fp16"]
    assert cli.main(argv) == USAGE
    err = capsys.readouterr().err
    assert "--soc SM8350 at fp16: QNN 2.51 does not compile an RmsNorm in fp16 for SM8350" in err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("soc", ["QCM6490", "SW6100"])
def test_the_same_soc_is_accepted_at_a_quantized_precision_and_refused_at_fp16(soc):
    class Args:
        precision = "16a8w"

    Args.soc = soc
    assert qnn_options(Args, "--backend qnn", True) == (soc, "16a8w")
    Args.precision = None  # fp16 by default
    with pytest.raises(UsageError, match=f"--soc {soc} at fp16"):
        qnn_options(Args, "--backend qnn", True)
