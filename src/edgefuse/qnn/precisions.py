"""The precisions :func:`edgefuse.qnn.lower` compiles for, as plain data a command reads before it loads
torch: HTP float16, or a ``QuantDtype`` of ExecuTorch's ``QnnQuantizer`` (activation bits ``a``, weight
bits ``w``), calibrated on the example inputs. The names are those of :mod:`edgefuse.core.precisions`."""

from edgefuse.core.precisions import FLOAT

#: Each precision ``lower`` takes, float16 first.
LOWER_PRECISIONS = (FLOAT, "16a8w", "16a16w", "8a8w", "16a4w")

#: The ``QuantDtype`` member of each quantized precision ``lower`` takes.
LOWER_QUANT_DTYPES = {name: f"use_{name}" for name in LOWER_PRECISIONS[1:]}
