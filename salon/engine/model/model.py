"""CausalLM: the decoder skeleton every architecture shares, one code path for both precisions.

    x = embed(token_ids) * embedding_multiplier
    x = layer(x) for each decoder layer (the architecture's own: models/gemma3.py, models/llama.py; the layers the
        kernel family fuses run first, all in one call: layers.fused_layers)
    hidden = rmsnorm(x, final_norm);  logits = lm_head(hidden)

The engine sees only this: `forward(token_ids, positions, attn) -> hidden`, `logits(hidden)` (or
`logits_and_argmax(hidden)`: with each row's argmax where the output projection finds it on the way), `config`,
`kernel_ops`, `precision`; `attn` is the AttentionBackend each layer calls as attn(layer_idx, q, k, v).
"""

from __future__ import annotations

import torch

from salon.engine.model.attention import AttentionBackend
from salon.engine.model.config import ModelConfig
from salon.engine.model.layers import Embedding, fused_layers
from salon.kernels.backend import Ops


class CausalLM:
    def __init__(
        self,
        config: ModelConfig,
        embed: Embedding,
        layers: list,
        final_norm: torch.Tensor,
        lm_head: object,
        precision: str,
        kernel_ops: Ops,
        numerics: str | None = None,
    ) -> None:
        self.config = config
        self.embed = embed
        # Decoder layers: layer(x, positions, attn) -> x; each holds Linears named qkv, o, gate_up, down.
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head  # Linear d_model -> vocab (the embedding table when tied)
        self.precision = precision
        # the precision with what else decides the numbers ("int8-a16": int16 activations), for cache namespaces
        self.numerics = numerics or precision
        self.kernel_ops = kernel_ops
        self._embed_scale = (
            None
            if config.embedding_multiplier == 1.0
            else torch.tensor(config.embedding_multiplier, dtype=torch.float32)
        )

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        """token_ids, positions: int64[T] -> hidden f32[T, d_model] (final norm applied)."""
        x = self.embed.lookup(token_ids)
        if self._embed_scale is not None:
            x = x * self._embed_scale
        x, done = fused_layers(self.layers, self.kernel_ops, x, attn)
        for layer in self.layers[done:]:
            x = layer(x, positions, attn)
        return self.kernel_ops.rmsnorm(x, self.final_norm, self.config.rms_norm_eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden f32[R, d_model] -> logits f32[R, vocab] (no soft-capping)."""
        return self.lm_head(hidden)

    @torch.inference_mode()
    def logits_and_argmax(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits(hidden), each row's argmax of them, int64[R], where the output projection finds it on the way;
        else None)."""
        with_argmax = getattr(self.lm_head, "with_argmax", None)
        return with_argmax(hidden) if with_argmax is not None else (self.lm_head(hidden), None)

    def weight_bytes(self) -> int:
        total = self.embed.nbytes() + self.final_norm.numel() * 4
        if not self.config.tied_embeddings:
            total += self.lm_head.nbytes()
        for layer in self.layers:
            total += layer.nbytes()
        return total
