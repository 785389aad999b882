"""Seeded random weights for synthetic configs, named like the converted GGUF weights.

Norm weights are drawn around 1 (they already include Gemma's +1); projections are scaled by
1/sqrt(fan_in) so activations stay O(1) through the layers. KV-sharing layers get no k/v weights.
"""

from __future__ import annotations

import torch

from salon.engine.model.config import ModelConfig


def synthetic_weights(config: ModelConfig) -> dict[str, torch.Tensor]:
    if config.random_weights_seed is None:
        raise ValueError(f"{config.model_id} has no random_weights_seed")
    gen = torch.Generator().manual_seed(config.random_weights_seed)
    d, hq, hkv, hd, f = config.d_model, config.num_heads, config.num_kv_heads, config.head_dim, config.ffn_dim

    def mat(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, generator=gen) / k**0.5

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    w = {"embed": torch.randn(config.vocab_size, d, generator=gen) * 0.05, "final_norm": norm(d)}
    for i, spec in enumerate(config.layers):
        p = f"layers.{i}."
        w[p + "attn_norm"], w[p + "ffn_norm"] = norm(d), norm(d)
        w[p + "post_attention_norm"], w[p + "post_ffw_norm"] = norm(d), norm(d)
        w[p + "attn_q"], w[p + "attn_q_norm"] = mat(hq * hd, d), norm(hd)
        if spec.kv_source_layer is None:
            w[p + "attn_k"], w[p + "attn_v"], w[p + "attn_k_norm"] = mat(hkv * hd, d), mat(hkv * hd, d), norm(hd)
        w[p + "attn_output"] = mat(d, hq * hd)
        w[p + "ffn_gate"], w[p + "ffn_up"], w[p + "ffn_down"] = mat(f, d), mat(f, d), mat(d, f)
    return w
