"""Tests of the shared runtime code (``edgefuse.runtime``)."""
