"""The QNN set-up's self-check: one RmsNorm compiled by QNN and run on the HTP emulator, against eager.

``python -m edgefuse.qnn.selfcheck RESULT.json`` runs it in a process whose environment names the
libraries (``QNN_SDK_ROOT``, ``LD_LIBRARY_PATH``) and writes the result as JSON; it prints nothing of
its own, so what the process writes is QNN's and ExecuTorch's log.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import torch

from edgefuse.core._fx import ops_outside
from edgefuse.qnn.sdk import SelfCheck

#: The norm checked: ``[1, 8, 64]`` float32, lowered at fp16 for SM8650 (a shape QNN computes right).
SHAPE = (1, 8, 64)
SOC = "SM8650"


class RmsNormBlock(torch.nn.Module):
    """``F.rms_norm`` with a weight, alone: what QNN must compile to one ``RmsNorm``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, 1e-6)


def lower_fp16(module: torch.nn.Module, inputs: tuple, soc: str = SOC):
    """``module`` through ExecuTorch's own QNN flow (``to_edge_transform_and_lower_to_qnn``) at fp16."""
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        to_edge_transform_and_lower_to_qnn,
    )

    specs = generate_qnn_executorch_compiler_spec(
        soc_model=getattr(QcomChipset, soc), backend_options=generate_htp_compiler_spec(use_fp16=True)
    )
    return to_edge_transform_and_lower_to_qnn(module, inputs, specs)


def example() -> tuple[RmsNormBlock, tuple[torch.Tensor]]:
    """The norm checked and its input (values of scale about 5 after the weight)."""
    torch.manual_seed(0)
    return RmsNormBlock(SHAPE[-1]).eval(), (torch.randn(SHAPE) * 1.5,)


def check() -> SelfCheck:
    """Lower one RmsNorm at fp16, run it on the emulator, compare with eager (the libraries must
    already be reachable: by the environment, or :func:`edgefuse.qnn.sdk.ensure_in_process`)."""
    from edgefuse.qnn.emulator import to_pte
    from edgefuse.runtime import LoadedProgram
    from edgefuse.core.verify import TOLERANCES, compare

    module, (x,) = example()
    try:
        edge = lower_fp16(module, (x,))
    except Exception as error:  # QNN failing to start or to compile: the result, not a crash
        return SelfCheck(False, f"lowering failed: {type(error).__name__}: {error}")
    left = ops_outside(edge)
    if left:
        return SelfCheck(False, f"QNN did not take the whole norm: {', '.join(left)} stayed outside")
    try:
        out = LoadedProgram(to_pte(edge)).run((x,))[0]
    except Exception as error:
        return SelfCheck(False, f"running on the HTP emulator failed: {type(error).__name__}: {error}")
    with torch.no_grad():
        expected = module(x)
    got = compare(expected, out.to(expected.dtype), ulps=TOLERANCES["qnn set-up"].ulps, dtype=torch.float16)
    detail = f"RmsNorm {list(SHAPE)} fp16 on the HTP emulator: max error {got.max_error:.2e}, allowed {got.allowed:.2e}"
    return SelfCheck(got.shape_ok and got.max_error <= got.allowed, detail, got.max_error, got.allowed)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    result = check()
    with open(argv[0], "w") as f:
        json.dump(asdict(result), f)
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
