"""The precisions :func:`edgefuse.qnn.lower` compiles for, as plain data a command reads before it loads
torch: HTP float16, or a ``QuantDtype`` of ExecuTorch's ``QnnQuantizer`` (activation bits ``a``, weight
bits ``w``), calibrated on the example inputs."""

#: Each precision ``lower`` takes, float16 first.
PRECISIONS = ("fp16", "16a8w", "16a16w", "8a8w", "16a4w")

#: The ``QuantDtype`` member of each quantized precision.
QUANT_DTYPES = {"16a8w": "use_16a8w", "16a16w": "use_16a16w", "8a8w": "use_8a8w", "16a4w": "use_16a4w"}
