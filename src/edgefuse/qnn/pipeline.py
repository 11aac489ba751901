"""ExecuTorch's own QNN flow, with edgefuse's passes in place of the stock ones: :func:`lower`.

For a quantized precision the model is captured, annotated by the released ``QnnQuantizer`` (whose
annotation pipeline runs the passes), calibrated and converted (``prepare_pt2e``/``convert_pt2e``);
then, for every precision, ``to_edge_transform_and_lower_to_qnn`` exports it, runs QNN's export and
to_edge passes and partitions and compiles it for the HTP of ``soc``. With ``recompose="edgefuse"`` all
of this runs inside :func:`edgefuse.qnn.patched` for that SoC, so every norm is held to the limits
measured on its HTP generation and a quantized ``RmsNorm`` rounds to nearest; with ``"stock"`` the
released flow runs untouched, for comparison.
"""

from __future__ import annotations

import contextlib
import io
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from edgefuse.qnn.emulator import to_pte
from edgefuse.qnn.sdk import QnnSdkUnavailable, ensure_in_process
from edgefuse.qnn.graphs import QnnGraphs, qnn_graphs, recording_compiled_graphs
from edgefuse.qnn.passes import PassRun, patched
from edgefuse.qnn.precisions import LOWER_PRECISIONS, LOWER_QUANT_DTYPES
from edgefuse.qnn.socs import soc_problem
from edgefuse.core.legalize import Legalized
from edgefuse.core.recompose import Decision

#: Whose passes run in QNN's pipelines: edgefuse's, or the released ones untouched.
RECOMPOSE = ("edgefuse", "stock")
_EDGEFUSE = str(Path(__file__).resolve().parents[1])


class QnnLoweringFailed(RuntimeError):
    """QNN could not lower the model; the message carries QNN's reason (the command line exits 2: the
    model is the input)."""


#: The QNN libraries are not set up in this process; the message names ``edgefuse qnn setup`` (exit 3).
QnnLibrariesMissing = QnnSdkUnavailable


@dataclass
class QnnLowered:
    """A model lowered by ExecuTorch's QNN flow.

    ``edge`` is the lowered ``EdgeProgramManager``; ``decisions`` the norm decisions of every edgefuse
    pass run and ``legalized`` what the SoC's limits did to each ``rms_norm`` (``limits`` says which
    generation's; ``runs`` says which pipeline ran each; all empty for ``recompose="stock"``); ``graphs`` what
    QNN built (:class:`~edgefuse.qnn.graphs.QnnGraphs`). ``reference`` is what the program is compared
    with: the eager model for ``fp16``, the converted (fake-quantized) program run in eager for the
    quantized precisions; ``calibration`` the inputs it was calibrated on.
    """

    edge: Any
    decisions: list[Decision]
    graphs: QnnGraphs
    runs: list[PassRun]
    soc: str
    precision: str
    recompose: str
    compiler_specs: list
    reference: torch.nn.Module
    example_inputs: tuple
    calibration: list[tuple] = field(default_factory=list)
    legalized: list[Legalized] = field(default_factory=list)
    limits: str = ""

    @property
    def quantized(self) -> bool:
        return self.precision != "fp16"

    def to_pte(self) -> bytes:
        """The ``.pte`` bytes: the graph inputs and outputs planned in memory and segments aligned as the
        QNN delegate needs them."""
        return to_pte(self.edge)


def compiler_specs(soc: str, precision: str) -> list:
    """The compiler specs of ExecuTorch's QNN flow for the HTP of ``soc`` at ``precision``."""
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
    )

    from edgefuse.qnn.socs import qnn_socs

    known = qnn_socs()
    if soc not in known:
        raise ValueError(f"unknown SoC {soc!r}: QNN knows {', '.join(known)}")
    return generate_qnn_executorch_compiler_spec(
        soc_model=QcomChipset[soc], backend_options=generate_htp_compiler_spec(use_fp16=precision == "fp16")
    )


def lower(
    model: torch.nn.Module,
    example_inputs: Sequence[Any],
    *,
    soc: str = "SM8650",
    precision: str = "fp16",
    calibration: Iterable[Sequence[Any]] | None = None,
    recompose: str = "edgefuse",
) -> QnnLowered:
    """Lower ``model`` with ExecuTorch's QNN flow for the HTP of ``soc`` at ``precision``.

    ``calibration`` holds the input tuples a quantized precision is calibrated on (default: the example
    inputs alone). Raises :class:`QnnLoweringFailed` with QNN's reason when QNN cannot lower the model,
    :class:`QnnLibrariesMissing` when the QNN libraries are not set up, ``ValueError`` for an unknown
    precision, SoC or recompose; a precision QNN was measured not to compile for ``soc``
    (:func:`edgefuse.qnn.socs.soc_problem`) raises :class:`QnnLoweringFailed` before any work.
    """
    if precision not in LOWER_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(LOWER_PRECISIONS)}")
    if recompose not in RECOMPOSE:
        raise ValueError(f"unknown recompose {recompose!r}: choose one of {', '.join(RECOMPOSE)}")
    example_inputs = tuple(example_inputs)
    specs = compiler_specs(soc, precision)
    refused = soc_problem(soc, precision)
    if refused is not None:
        raise QnnLoweringFailed(refused)
    ensure_in_process()
    swap = patched(soc) if recompose == "edgefuse" else contextlib.nullcontext(None)
    with swap as patch, recording_compiled_graphs() as compiled:
        calibrated: list[tuple] = []
        reference: torch.nn.Module = model
        with _qnn_reason(soc, precision):
            if precision != "fp16":
                calibrated = [tuple(c) for c in calibration] if calibration is not None else [example_inputs]
                reference = _quantize(model, example_inputs, calibrated, soc, LOWER_QUANT_DTYPES[precision])
            edge = _to_edge_and_lower(reference, example_inputs, specs)
    runs = list(patch.runs) if patch is not None else []
    decisions = [d for run in runs for d in run.decisions]
    return QnnLowered(
        edge, decisions, qnn_graphs(edge, compiled, decisions, patch.nearest if patch is not None else ()), runs, soc, precision, recompose, specs,
        reference, example_inputs, calibrated, [n for run in runs for n in run.legalized],
        patch.note if patch is not None else "",
    )


def _quantize(model, example_inputs: tuple, calibration: list[tuple], soc: str, quant_dtype: str) -> torch.nn.Module:
    """Capture, annotate with the released ``QnnQuantizer``, calibrate and convert: the fake-quantized module."""
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset, QnnExecuTorchBackendType
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = QnnQuantizer(backend=QnnExecuTorchBackendType.kHtpBackend, soc_model=getattr(QcomChipset, soc))
    quantizer.set_default_quant_config(getattr(QuantDtype, quant_dtype), is_conv_per_channel=True, is_linear_per_channel=True)
    with torch.no_grad():
        captured = torch.export.export(model, example_inputs).module()
    with contextlib.redirect_stdout(io.StringIO()):  # the released quantizer prints a line per op it skips
        prepared = prepare_pt2e(captured, quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    return convert_pt2e(prepared)


def _to_edge_and_lower(module: torch.nn.Module, example_inputs: tuple, specs: list):
    from executorch.backends.qualcomm.utils.utils import to_edge_transform_and_lower_to_qnn

    with torch.no_grad():  # a model's own no_grad regions then export as plain ops
        return to_edge_transform_and_lower_to_qnn(module, example_inputs, specs)


@contextlib.contextmanager
def _qnn_reason(soc: str, precision: str):
    """Turn a failure of ExecuTorch's QNN flow into :class:`QnnLoweringFailed` with its reason; an error
    raised inside edgefuse's own code passes unchanged (it is edgefuse's bug, not the model's)."""
    try:
        yield
    except Exception as error:
        if isinstance(error, QnnSdkUnavailable) or raised_in_edgefuse(error):
            raise
        raise QnnLoweringFailed(f"QNN could not lower the model for {soc} at {precision}: {failure_reason(error)}") from error


def _chain(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return chain


def raised_in_edgefuse(error: BaseException) -> bool:
    """Whether the innermost error of the chain was raised by a frame of edgefuse's package."""
    frames = traceback.extract_tb(_chain(error)[-1].__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_EDGEFUSE)


def failure_reason(error: BaseException, limit: int = 400) -> str:
    """The messages of an error's chain, outermost first, each once and at most ``limit`` characters."""
    parts = []
    for e in _chain(error):
        text = " ".join(str(e).split()) or type(e).__name__
        text = text if len(text) <= limit else text[: limit - 3] + "..."
        if text not in parts:
            parts.append(f"{type(e).__name__}: {text}" if not parts else text)
    return " <- ".join(parts)
