"""Tests of the XNNPACK backend (``edgefuse.xnnpack``)."""
