"""The QNN tier: tests that compile with QNN's libraries and run programs on QNN's x86 HTP emulator.

A test that needs the libraries asks for the ``qnn_sdk`` fixture: it runs wherever they are set up
(``edgefuse qnn setup``, or ``QNN_SDK_ROOT`` naming a QNN SDK) and is skipped elsewhere with the
reason and that command. The fixture loads the libraries into the test process once. Programs that
several tests read are lowered once per session (QNN compiles for seconds each).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from pathlib import Path

from edgefuse.qnn.sdk import Sdk, ensure_in_process, find, pinned_set_up


@pytest.fixture(scope="session")
def qnn_sdk() -> Sdk:
    """The QNN SDK this process uses, loaded; skips the test when there is none."""
    sdk = find()
    if not sdk:
        pytest.skip(f"QNN tier: {sdk.reason}")
    return ensure_in_process(sdk)


@pytest.fixture(scope="session")
def edgefuse_sdk(qnn_sdk: Sdk) -> Sdk:
    """The SDK, when it is a set-up of edgefuse's (not a QNN SDK the user named)."""
    if not qnn_sdk.manifest:
        pytest.skip(f"QNN tier: {qnn_sdk.root} is a QNN SDK edgefuse did not set up; run `edgefuse qnn setup DIR` to test one")
    return qnn_sdk


@pytest.fixture(scope="session")
def pinned_libraries() -> Path:
    """The default set-up's folder, whose QNN libraries are the pinned ones, even when its wrapper was
    built from another C source (then the tests that use the SDK skip, and this one still runs)."""
    root = pinned_set_up()
    if root is None:
        pytest.skip("QNN tier: no set-up of the pinned QNN libraries; run `edgefuse qnn setup`")
    return root


@dataclass
class QnnProgram:
    """A module, its example inputs, and the program ExecuTorch's QNN flow made of it: the edge program
    and its ``.pte`` bytes."""

    module: torch.nn.Module
    inputs: tuple
    edge: object
    pte: bytes


@pytest.fixture(scope="session")
def lowered_rms_norm(qnn_sdk: Sdk) -> QnnProgram:
    """The self-check's RmsNorm, lowered at fp16 for SM8650 with ExecuTorch's own QNN flow."""
    from edgefuse.qnn.emulator import to_pte
    from edgefuse.qnn.selfcheck import example, lower_fp16

    module, inputs = example()
    edge = lower_fp16(module, inputs)
    return QnnProgram(module, inputs, edge, to_pte(edge))


@pytest.fixture(scope="session")
def lowered_rms_norm_16a8w(qnn_sdk: Sdk) -> QnnProgram:
    """The same norm quantized 16a8w with the released ``QnnQuantizer`` (calibrated on its input) and
    lowered for SM8650; ``module`` is the converted, fake-quantized module."""
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset, QnnExecuTorchBackendType
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        to_edge_transform_and_lower_to_qnn,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgefuse.qnn.emulator import to_pte
    from edgefuse.qnn.selfcheck import example

    module, inputs = example()
    quantizer = QnnQuantizer(backend=QnnExecuTorchBackendType.kHtpBackend, soc_model=QcomChipset.SM8650)
    quantizer.set_default_quant_config(QuantDtype.use_16a8w)
    prepared = prepare_pt2e(torch.export.export(module, inputs).module(), quantizer)
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    specs = generate_qnn_executorch_compiler_spec(
        soc_model=QcomChipset.SM8650, backend_options=generate_htp_compiler_spec(use_fp16=False)
    )
    edge = to_edge_transform_and_lower_to_qnn(converted, inputs, specs)
    return QnnProgram(converted, inputs, edge, to_pte(edge))
