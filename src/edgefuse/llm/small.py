"""Small params of ExecuTorch's Llama and Qwen3 (its ``ModelArgs``), the models the LLM checks export.

Plain data, readable without torch, so a command lists the cases built on them before it loads torch.
"""

from __future__ import annotations

#: Small Llama params (ExecuTorch's ``ModelArgs``): the export's max context comes from its config.
SMALL_LLAMA = {
    "dim": 64, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "hidden_dim": 128,
    "norm_eps": 1e-5, "rope_theta": 500000.0,
}
#: Small Qwen3 params: QK norm before RoPE, Hugging Face RoPE, as ExecuTorch's Qwen3 configs set them.
SMALL_QWEN3 = {
    **SMALL_LLAMA, "norm_eps": 1e-6, "rope_theta": 1000000.0, "use_qk_norm": True, "qk_norm_before_rope": True,
    "use_hf_rope": True, "head_dim": 16,
}
