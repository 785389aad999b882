"""Model architecture description: one frozen dataclass per model, one LayerSpec per layer.

Real models get theirs from the GGUF's metadata (models/gemma3.py, models/llama.py: `config_from_gguf`);
synthetic ones (random weights, for tests and development) are defined here. The per-layer spec carries
every attention knob the runtime needs to size and address the KV cache: attention type (global or
sliding window of W tokens), RoPE base and position scale, and cross-layer KV sharing (a layer with
``kv_source_layer`` set reads the KV written by that earlier layer and owns no cache of its own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

AttentionKind = Literal["global", "sliding"]
# Activation of the gated MLP: out = act(gate(x)) * up(x).
Activation = Literal["gelu_tanh", "silu"]


@dataclass(frozen=True)
class LayerSpec:
    attention: AttentionKind
    # Sliding-window semantics: the query at position p sees keys at k with k <= p and p - k < W.
    sliding_window_tokens: int | None
    rope_base: float
    # None: this layer computes and caches its own K/V. Otherwise the index of an earlier layer whose
    # K/V this layer reads (that layer must itself produce KV and have the same attention geometry).
    kv_source_layer: int | None = None
    # Linear RoPE scaling: the rotation angle uses position * rope_position_scale (1 / the file's factor).
    rope_position_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.attention == "sliding" and (self.sliding_window_tokens is None or self.sliding_window_tokens < 1):
            raise ValueError("sliding layers need sliding_window_tokens >= 1")
        if self.attention == "global" and self.sliding_window_tokens is not None:
            raise ValueError("global layers have no sliding window")


@dataclass(frozen=True)
class ModelConfig:
    model_id: str
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_dim: int
    rms_norm_eps: float
    max_context_tokens: int
    bos_token_id: int
    # Tokens that end generation: the file's EOS, its end-of-turn marker(s) (llama.cpp's EOG set).
    eos_token_ids: tuple[int, ...]
    layers: tuple[LayerSpec, ...]
    # Attention logits are multiplied by this (Gemma 3: 1/sqrt(query_pre_attn_scalar=256)).
    attn_scale: float = 1.0 / 16.0
    pad_token_id: int = 0
    # Synthetic configs draw seeded random weights instead of loading a checkpoint.
    random_weights_seed: int | None = None
    # The architecture's code (models/<architecture>.py) and the knobs it reads.
    architecture: str = "gemma3"
    activation: Activation = "gelu_tanh"
    # Gemma 3: RMSNorm of each head's q and k before RoPE, and RMSNorm of each sublayer's output.
    qk_norm: bool = True
    post_norms: bool = True
    # Input embeddings are multiplied by this (Gemma: sqrt(d_model); Llama: 1).
    embedding_multiplier: float = 1.0
    # The output projection is the embedding matrix (no separate `output` tensor in the file).
    tied_embeddings: bool = True
    # Whether a prompt starts with BOS (tokenizer.ggml.add_bos_token).
    add_bos: bool = True
    # The file's RoPE layout: "neox" (halves) or "adjacent" (pairs 2i, 2i+1: llama files, whose q/k rows are
    # permuted back at load). The runtime always rotates halves.
    rope_type_in_file: str = "neox"
    # sha256 of the GGUF the weights come from ("" for synthetic models): names the weights exactly.
    weights_sha256: str = ""

    def __post_init__(self) -> None:
        if len(self.layers) != self.num_layers:
            raise ValueError(f"{self.model_id}: {len(self.layers)} layer specs for {self.num_layers} layers")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        for i, spec in enumerate(self.layers):
            src = spec.kv_source_layer
            if src is None:
                continue
            if not 0 <= src < i:
                raise ValueError(f"layer {i}: kv_source_layer {src} must be an earlier layer")
            if self.layers[src].kv_source_layer is not None:
                raise ValueError(f"layer {i}: kv_source_layer {src} itself reuses KV")
            if (self.layers[src].attention, self.layers[src].sliding_window_tokens) != (
                spec.attention,
                spec.sliding_window_tokens,
            ):
                raise ValueError(f"layer {i}: shares KV with layer {src} of a different attention kind")

    def kv_layers(self) -> list[int]:
        """Indices of the layers that produce (and cache) their own K/V."""
        return [i for i, s in enumerate(self.layers) if s.kv_source_layer is None]

    def kv_source(self, layer_idx: int) -> int:
        """The layer whose cache ``layer_idx`` reads (itself unless it shares)."""
        src = self.layers[layer_idx].kv_source_layer
        return layer_idx if src is None else src

    def kv_bytes_per_token(self, bytes_per_value: float = 1.0, scale_bytes: int = 4) -> int:
        """Cache bytes one token occupies over all KV-producing layers, at full context.

        int8 KV (bytes_per_value=1) also stores one float32 scale per token per KV head for K and V.
        Sliding layers are counted at full size here: they bound the *live* tokens, not the per-token cost.
        """
        per_layer = 2 * self.num_kv_heads * (self.head_dim * bytes_per_value + scale_bytes)
        return int(len(self.kv_layers()) * per_layer)


GEMMA3_VOCAB_SIZE = 262144
# The Gemma vocabulary's end-of-generation ids (<eos>, <end_of_turn>, </s>): synthetic models use that vocabulary.
GEMMA3_EOS_TOKEN_IDS = (1, 106, 212)


def synthetic_config(name: str) -> ModelConfig:
    """Small random-weight Gemma-3-architecture configs over the real Gemma vocabulary (its tokenizer applies).

    synthetic-tiny: 4 layers, d_model 64, 4 query heads over 2 KV heads (GQA), head_dim 16;
      layer 0 sliding (W=32), layer 1 global, layer 2 sliding (W=32) reusing layer 0's KV,
      layer 3 global reusing layer 1's KV.
    synthetic-tiny-noshare: the same without sharing (the KV-bytes comparison point).
    synthetic-tiny-v4k: synthetic-tiny over the first 4,096 ids of the vocabulary only (a small output
      projection: what Triton's interpreter can run end to end in seconds).
    """
    vocab_size = GEMMA3_VOCAB_SIZE
    if name == "synthetic-tiny":
        sharing = (None, None, 0, 1)
    elif name == "synthetic-tiny-v4k":
        sharing, vocab_size = (None, None, 0, 1), 4096
    elif name == "synthetic-tiny-noshare":
        sharing = (None, None, None, None)
    else:
        raise ValueError(f"unknown synthetic config {name!r}")
    kinds = ("sliding", "global", "sliding", "global")
    layers = tuple(
        LayerSpec(k, 32 if k == "sliding" else None, 10_000.0 if k == "sliding" else 1_000_000.0, src)
        for k, src in zip(kinds, sharing)
    )
    return ModelConfig(
        model_id=name,
        vocab_size=vocab_size,
        d_model=64,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        ffn_dim=128,
        rms_norm_eps=1e-6,
        max_context_tokens=4096,
        bos_token_id=2,
        eos_token_ids=GEMMA3_EOS_TOKEN_IDS,
        layers=layers,
        attn_scale=1.0 / 4.0,
        random_weights_seed=1234,
        embedding_multiplier=math.sqrt(64),
    )
