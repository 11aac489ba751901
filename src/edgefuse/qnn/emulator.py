"""Write a program lowered for QNN to a ``.pte`` and run it on QNN's x86 HTP emulator.

A QNN program runs in the released ``executorch.runtime`` (its bindings register ``QnnBackend``) once
the QNN libraries are loaded (:func:`edgefuse.qnn.sdk.ensure_in_process`); on an x86 machine the HTP
library runs the compiled graph on its emulator. Two settings differ from a CPU program: the memory
planner must allocate the graph's inputs and outputs (the QNN delegate reads and writes them in
place), and segments are aligned as QNN's context binaries require.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from edgefuse.qnn.sdk import Sdk, ensure_in_process


def backend_config():
    """The ``ExecutorchBackendConfig`` QNN programs are written with."""
    from executorch.backends.qualcomm.utils.utils import get_qnn_context_binary_alignment
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    return ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=True, alloc_graph_output=True),
        segment_alignment=get_qnn_context_binary_alignment(),
    )


def to_pte(edge) -> bytes:
    """The ``.pte`` bytes of an ``EdgeProgramManager`` lowered to QNN."""
    return edge.to_executorch(backend_config()).buffer


def run_on_emulator(pte: bytes, inputs: Sequence[Any], sdk: Sdk | None = None) -> list[torch.Tensor]:
    """The tensor outputs of one run of ``pte`` on the HTP emulator (the libraries of ``sdk``, default
    the one :func:`edgefuse.qnn.sdk.find` names); a failed load or run raises ``RuntimeError`` with what
    the runtime logged."""
    from edgefuse.runtime import LoadedProgram

    ensure_in_process(sdk)
    return LoadedProgram(pte).run(inputs)
