"""Tests of the rewriting core: the rules, the norm forms, the passes, cast removal and the comparison."""
