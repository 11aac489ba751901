"""edgefuse's builder of QNN's ``RmsNorm`` (ExecuTorch's ``aten.rms_norm.default`` node visitor), whose
quantized output rounds to the nearest level.

QNN's integer ``RmsNorm`` rounds its output down to its level (QNN 2.51's HTP emulator: one norm alone
lands about half a step below the exact norm), where the fake-quantized module rounds to the nearest.
ExecuTorch's builder hands the op a beta (bias) of zeros; :class:`NearestRmsNormVisitor` hands a
quantized norm a beta of half its output step instead, one level of an encoding of its own (scale half the
output's, offset 0), so ``floor((y + s/2) / s)`` is ``y / s`` rounded to nearest. A float norm keeps
the zero beta. :func:`nearest_rms_norm` puts the builder in ExecuTorch's registry for the length of a
block (:func:`edgefuse.qnn.patched` opens one), and the released builder back after it.

The registry is the process's, but the beta is the block's thread's: while a block is open, a lowering in
another thread with no block of its own (a released flow run beside edgefuse's) builds its norms as
ExecuTorch's builder does, zero beta and not recorded. Each thread keeps a stack of its open blocks, and
a norm built with the half-step beta is recorded in the innermost block still open, also when blocks end
out of order.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import warnings
from typing import Iterator

import torch

#: ExecuTorch's registry of QNN node visitors, and the target the rms_norm builder is registered for.
VISITORS_MODULE = "executorch.backends.qualcomm.builders.node_visitor_manager"
RMS_NORM_TARGET = "aten.rms_norm.default"
#: The name ExecuTorch's builder gives the beta it makes for a norm (the norm's name and this suffix).
_BETA_SUFFIX = "_runtime_bias"


_LOCK = threading.RLock()
_RELEASED: list[type] = []


def _registry() -> dict:
    importlib.import_module("executorch.backends.qualcomm.builders")  # registers every released visitor
    return importlib.import_module(VISITORS_MODULE)._node_visitor_dict


def _released() -> type:
    """ExecuTorch's own ``RmsNorm`` builder: read from the registry the first time (the module that defines
    it keeps no name for it: its registering decorator returns None), before any block replaces it."""
    with _LOCK:
        if not _RELEASED:
            _RELEASED.append(_registry()[RMS_NORM_TARGET])
        return _RELEASED[0]


def half_step_beta(step: float, like: torch.Tensor) -> torch.Tensor:
    """The beta that makes a norm whose output rounds down round to nearest: half the output ``step``, in
    float32 (the builder's zeros take the dtype of the weight, quantized levels already; a float32 tensor
    is quantized by the encoding it is given)."""
    return torch.full(like.shape, step / 2, dtype=torch.float32)


def _make_visitor():
    from executorch.backends.qualcomm.utils.constants import QCOM_QUANT_ATTRS, QCOM_SCALE, QCOM_ZERO_POINT

    class NearestRmsNormVisitor(_released()):
        """ExecuTorch's ``RmsNorm`` builder, with a quantized norm's beta half its output step (one level
        of scale ``step / 2``, offset 0) so that QNN's rounding down of the output becomes rounding to
        nearest; the name of each norm it builds so goes to the list of the open block (:func:`nearest_rms_norm`)."""

        def define_node(self, node, nodes_to_wrappers):
            block = innermost_block()
            if block is None:  # no block open in this thread: ExecuTorch's builder, as released
                return super().define_node(node, nodes_to_wrappers)
            self._norm, self._block, self._beta = node, block, False
            try:
                built = super().define_node(node, nodes_to_wrappers)
            finally:
                self._norm = self._block = None
            if built is not None and node.meta.get(QCOM_QUANT_ATTRS) and not self._beta:
                warnings.warn(
                    f"edgefuse: no beta named {node.name + _BETA_SUFFIX!r} was built for the quantized norm "
                    f"{node.name!r}: QNN's RmsNorm rounds its output down, not to nearest (has ExecuTorch's "
                    "RmsNorm builder changed?)",
                    stacklevel=2,
                )
            return built

        def define_tensor(self, tensor_source_node, target_build_node, tensor, *args, **kwargs):
            norm = getattr(self, "_norm", None)
            attrs = tensor_source_node.meta.get(QCOM_QUANT_ATTRS)
            if (norm is not None and target_build_node is norm and attrs
                    and tensor_source_node.name == norm.name + _BETA_SUFFIX):
                step = float(attrs[QCOM_SCALE])
                tensor_source_node.meta[QCOM_QUANT_ATTRS] = {**attrs, QCOM_SCALE: step / 2, QCOM_ZERO_POINT: 0}
                tensor = half_step_beta(step, tensor)
                self._beta = True
                record = self._block.record
                if record is not None and norm.name not in record:
                    record.append(norm.name)
            return super().define_tensor(tensor_source_node, target_build_node, tensor, *args, **kwargs)

    NearestRmsNormVisitor.__module__ = __name__
    NearestRmsNormVisitor.__qualname__ = "NearestRmsNormVisitor"
    return NearestRmsNormVisitor


_VISITOR: list[type] = []
#: How many :func:`nearest_rms_norm` blocks are open, in every thread.
_OPEN: list[int] = [0]
#: Each thread's open blocks (``blocks``), innermost last.
_THREAD = threading.local()


class _Block:
    """One open :func:`nearest_rms_norm` block: the list it records norm names in (or None)."""

    def __init__(self, record: list[str] | None):
        self.record = record


def _blocks() -> list[_Block]:
    blocks = getattr(_THREAD, "blocks", None)
    if blocks is None:
        blocks = _THREAD.blocks = []
    return blocks


def innermost_block() -> _Block | None:
    """The innermost :func:`nearest_rms_norm` block this thread has open, or None."""
    blocks = _blocks()
    return blocks[-1] if blocks else None


def visitor() -> type:
    """edgefuse's ``RmsNorm`` builder class (made once, on first use: it subclasses ExecuTorch's)."""
    with _LOCK:
        if not _VISITOR:
            _VISITOR.append(_make_visitor())
        return _VISITOR[0]


@contextlib.contextmanager
def nearest_rms_norm(record: list[str] | None = None) -> Iterator[type]:
    """Within the block, ExecuTorch's QNN lowering in this thread builds every ``rms_norm`` with
    :class:`NearestRmsNormVisitor` (the name of each quantized norm it gives the half-step beta goes to
    ``record`` of the innermost block this thread has open); after it (also when it raises) with the
    released builder again. Blocks may nest and end in any order: the registry holds the released builder
    again when the last one of every thread ends, and a lowering in a thread with no block open builds as
    the released builder does."""
    ours = visitor()
    block = _Block(record)
    with _LOCK:
        registry = _registry()
        _released()
        if _OPEN[0] == 0:
            registry[RMS_NORM_TARGET] = ours
        _OPEN[0] += 1
    blocks = _blocks()
    blocks.append(block)
    try:
        yield ours
    finally:
        blocks[:] = [b for b in blocks if b is not block]
        with _LOCK:
            _OPEN[0] -= 1
            if _OPEN[0] == 0:
                registry[RMS_NORM_TARGET] = _released()
