"""edgefuse's builder of QNN's ``RmsNorm`` (ExecuTorch's ``aten.rms_norm.default`` node visitor), whose
quantized output rounds to the nearest level.

QNN's integer ``RmsNorm`` rounds its output down to its level (QNN 2.51's HTP emulator: one norm alone
lands about half a step below the exact norm), where the fake-quantized module rounds to the nearest.
ExecuTorch's builder hands the op a beta (bias) of zeros; :class:`NearestRmsNormVisitor` hands a
quantized norm a beta of half its output step instead, one level of an encoding of its own (scale half the
output's, offset 0), so ``floor((y + s/2) / s)`` is ``y / s`` rounded to nearest. A float norm keeps
the zero beta. :func:`nearest_rms_norm` puts the builder in ExecuTorch's registry for the length of a
block (:func:`edgefuse.qnn.patched` opens one), and the released builder back after it.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import threading
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
            self._norm = node
            try:
                return super().define_node(node, nodes_to_wrappers)
            finally:
                self._norm = None

        def define_tensor(self, tensor_source_node, target_build_node, tensor, *args, **kwargs):
            norm = getattr(self, "_norm", None)
            attrs = tensor_source_node.meta.get(QCOM_QUANT_ATTRS)
            if (norm is not None and target_build_node is norm and attrs
                    and tensor_source_node.name == norm.name + _BETA_SUFFIX):
                step = float(attrs[QCOM_SCALE])
                tensor_source_node.meta[QCOM_QUANT_ATTRS] = {**attrs, QCOM_SCALE: step / 2, QCOM_ZERO_POINT: 0}
                tensor = half_step_beta(step, tensor)
                record = _RECORD.get()
                if record is not None and norm.name not in record:
                    record.append(norm.name)
            return super().define_tensor(tensor_source_node, target_build_node, tensor, *args, **kwargs)

    NearestRmsNormVisitor.__module__ = __name__
    NearestRmsNormVisitor.__qualname__ = "NearestRmsNormVisitor"
    return NearestRmsNormVisitor


_VISITOR: list[type] = []
#: How many :func:`nearest_rms_norm` blocks are open.
_OPEN: list[int] = [0]
#: The list the innermost open block of this thread (or task) records norm names in.
_RECORD: contextvars.ContextVar = contextvars.ContextVar("edgefuse_qnn_nearest", default=None)


def visitor() -> type:
    """edgefuse's ``RmsNorm`` builder class (made once, on first use: it subclasses ExecuTorch's)."""
    with _LOCK:
        if not _VISITOR:
            _VISITOR.append(_make_visitor())
        return _VISITOR[0]


@contextlib.contextmanager
def nearest_rms_norm(record: list[str] | None = None) -> Iterator[type]:
    """Within the block, ExecuTorch's QNN lowering builds every ``rms_norm`` with
    :class:`NearestRmsNormVisitor` (the name of each quantized norm it gives the half-step beta goes to
    ``record``); after it (also when it raises) with the released builder again. Blocks may nest and end
    in any order: the released builder returns when the last one ends."""
    ours = visitor()
    with _LOCK:
        registry = _registry()
        _released()
        if _OPEN[0] == 0:
            registry[RMS_NORM_TARGET] = ours
        _OPEN[0] += 1
    token = _RECORD.set(record)
    try:
        yield ours
    finally:
        _RECORD.reset(token)
        with _LOCK:
            _OPEN[0] -= 1
            if _OPEN[0] == 0:
                registry[RMS_NORM_TARGET] = _released()
