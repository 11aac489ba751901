"""Tests of the application: the ``edgefuse`` command and its tools."""
