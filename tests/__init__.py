"""edgefuse's tests, by layer; the helper modules are imported as ``tests.harness``, ``tests.forms`` and ``tests.xnnpack.xnn_helpers``."""
