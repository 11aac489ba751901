"""Tests of the quantized flows (``edgefuse.quant``)."""
