"""Tests of the fuzzer and the regressions it found."""
