"""Pass objects for ExecuTorch's ``EdgeProgramManager.transform`` and for plain ``GraphModule`` graphs.

Each pass is an ``ExportedProgramPassBase`` (so ``transform`` hands it the whole program and it can read
lifted constants) that can also be called on a ``GraphModule``, such as ``ExportedProgram.module()``,
where it returns a ``PassResult`` like any ``torch.fx`` pass.
"""

from __future__ import annotations

from torch.export import ExportedProgram
from torch.fx import GraphModule
from torch.fx.passes.infra.pass_base import PassResult

from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult

from edgefuse.core.profiles import BackendProfile, Precision
from edgefuse.core.recompose import Decision, recompose_rms_norm
from edgefuse.core.redundant_casts import remove_redundant_casts
from edgefuse.core.signature import sync_signature


class _DualPass(ExportedProgramPassBase):
    """A pass that runs on an ``ExportedProgram`` or on a ``GraphModule``."""

    def __call__(self, target: ExportedProgram | GraphModule):  # type: ignore[override]
        if isinstance(target, GraphModule):
            return PassResult(target, self._run(target))
        return super().__call__(target)

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        return ExportedProgramPassResult(exported_program, self._run(exported_program))

    def _run(self, target: ExportedProgram | GraphModule) -> bool:
        raise NotImplementedError


class RecomposeRmsNorm(_DualPass):
    """Rebuild decomposed RMSNorm for ``backend``; ``decisions`` holds the last run's decisions."""

    def __init__(
        self, backend: str | BackendProfile = "aten", quantization_capture: bool = False, precision: Precision | None = None
    ):
        self.backend = backend
        self.quantization_capture = quantization_capture
        self.precision = precision
        self.decisions: list[Decision] = []

    def _run(self, target: ExportedProgram | GraphModule) -> bool:
        result = recompose_rms_norm(
            target, backend=self.backend, quantization_capture=self.quantization_capture, precision=self.precision
        )
        self.decisions = result.decisions
        return bool(result.rebuilt)


class RemoveRedundantCasts(_DualPass):
    """Drop casts that change nothing; ``removed`` holds the names of the last run's removed casts."""

    def __init__(self) -> None:
        self.removed: list[str] = []

    def _run(self, target: ExportedProgram | GraphModule) -> bool:
        gm = target.graph_module if isinstance(target, ExportedProgram) else target
        self.removed = remove_redundant_casts(gm)
        if self.removed and isinstance(target, ExportedProgram):
            sync_signature(target)
        return bool(self.removed)
