"""Tests of edgefuse.hf: Hugging Face's export flow (optimum-executorch) with the edgefuse-xnnpack recipe."""
