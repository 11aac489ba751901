"""Tests of what the application reads (``edgefuse.inputs``): MODEL, ``.pt2`` files, the built-in models."""
