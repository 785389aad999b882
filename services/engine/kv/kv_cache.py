"""The paged KV cache tensors: one int8 K/V tensor pair (plus float32 scales) per slot.

Addressing follows kv_layout.py: layer L reads/writes slot `layout.layer_locations[L].slot`, at the
block ids of its group's block table. The tensors know nothing about requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.engine.kv.kv_layout import KVCacheLayout


@dataclass
class SlotTensors:
    k_cache: torch.Tensor  # int8[num_blocks, BS, Hkv, D]
    v_cache: torch.Tensor
    k_scale: torch.Tensor  # f32[num_blocks, BS, Hkv]
    v_scale: torch.Tensor


class KVCache:
    def __init__(self, layout: KVCacheLayout, device: torch.device | str = "cpu") -> None:
        self.layout = layout
        shape = (layout.num_blocks, layout.block_size_tokens, layout.num_kv_heads, layout.head_dim)
        self.slots = [
            SlotTensors(
                k_cache=torch.zeros(shape, dtype=torch.int8, device=device),
                v_cache=torch.zeros(shape, dtype=torch.int8, device=device),
                k_scale=torch.zeros(shape[:3], dtype=torch.float32, device=device),
                v_scale=torch.zeros(shape[:3], dtype=torch.float32, device=device),
            )
            for _ in range(layout.slots_per_block)
        ]

    def for_layer(self, layer_idx: int) -> SlotTensors:
        return self.slots[self.layout.layer_locations[layer_idx].slot]

    def allocated_bytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for s in self.slots for t in (s.k_cache, s.v_cache, s.k_scale, s.v_scale)
        )
