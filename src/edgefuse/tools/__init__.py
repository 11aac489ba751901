"""The measures that are commands of their own (``python -m edgefuse.tools.NAME``): model tables, the
benchmarks that print ratios against stock, and the pass-time comparison. None runs in the test suite."""
