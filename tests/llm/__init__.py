"""Tests of edgefuse.llm: the LLM export swap and the export recipes."""
