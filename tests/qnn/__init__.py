"""Tests of the QNN tier: QNN's libraries, its compiler and its x86 HTP emulator (``edgefuse.qnn``)."""
