"""Tests of the ``python -m edgefuse.tools`` measures."""
