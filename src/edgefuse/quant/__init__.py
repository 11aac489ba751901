"""edgefuse in the quantized flows: QNN quantization capture, and XNNPACK qs8 and 8da4w.

- :mod:`edgefuse.quant.facts`: tag each norm before ``prepare_pt2e`` (:func:`mark_norms`) and read how
  it was quantized from the converted graph (:func:`norm_quantization`): one op with one pair in and
  out, or its pieces quantized one by one, and the quantize/dequantize pairs it costs.
- :mod:`edgefuse.qnn.quantizer`: the QNN capture flow with the released ``QnnQuantizer``, built without an
  SDK download; :class:`~edgefuse.qnn.quantizer.QnnUnavailable` says why when it cannot be imported.
- :mod:`edgefuse.xnnpack.quantizer`: the pinned XNNPACK quantizer (qs8) and ExecuTorch's 8da4w source
  transform, lowered stock or with edgefuse, and where each mean went.
- ``python -m edgefuse.tools.quant``: the tables of both flows on the tiny models.

Importing this package imports neither ExecuTorch's Qualcomm backend nor its quantizers: the public
names below load on first use (PEP 562), so ``python -m edgefuse.tools.quant`` can quiet the libraries'
import-time warnings before anything loads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefuse.core.lazy import lazy_names

#: Each public name and the module that defines it.
_PUBLIC: dict[str, str] = {
    "NORM_KEY": "edgefuse.quant.facts",
    "NormQuantization": "edgefuse.quant.facts",
    "mark_norms": "edgefuse.quant.facts",
    "norm_quantization": "edgefuse.quant.facts",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from edgefuse.quant.facts import NORM_KEY, NormQuantization, mark_norms, norm_quantization


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
