"""The rewriting core: the op table of each dialect, cast semantics, the matchers, the backend profiles and
the passes that rebuild decomposed RMSNorm, and the comparison of two programs at a dtype's tolerance. It
imports nothing else of edgefuse's."""
