"""The names of the precisions a norm is computed in, as plain data that loads no torch: float16 (the HTP
computes a float graph in float16), and the quantized precisions as QNN's ``QuantDtype`` names them
without ``use_`` (``8a8w``: 8-bit activations, 8-bit weights)."""

FLOAT = "fp16"
QUANTIZED_PRECISIONS = ("16a16w", "16a8w", "16a4w", "16a4w_block", "8a8w", "8a4w", "fp16a8w", "16a2w")
#: A norm in a graph about to be quantized, or quantized already, at a precision edgefuse was not told.
QUANTIZED = "quantized"
PRECISIONS = (FLOAT, *QUANTIZED_PRECISIONS, QUANTIZED)
