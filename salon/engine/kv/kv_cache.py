"""The paged KV cache tensors: one K/V tensor pair per slot (int8 with float32 scales, or bf16/f32).

Addressing follows kv_layout.py: layer L reads/writes slot `layout.layer_locations[L].slot`, at the
block ids of its group's block table. The tensors know nothing about requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from salon.engine.kv.kv_layout import KVCacheLayout

TORCH_KV_DTYPES = {"int8": torch.int8, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class SlotTensors:
    k_cache: torch.Tensor  # [num_blocks, BS, Hkv, D] of the layout's kv_dtype
    v_cache: torch.Tensor
    k_scale: torch.Tensor | None  # f32[num_blocks, BS, Hkv] for int8 caches, else None
    v_scale: torch.Tensor | None

    def tensors(self) -> list[torch.Tensor]:
        """What the slot stores, in payload order (kv_transfer.py): K, V, then the scales if any."""
        return [t for t in (self.k_cache, self.v_cache, self.k_scale, self.v_scale) if t is not None]


class KVCache:
    def __init__(self, layout: KVCacheLayout, device: torch.device | str = "cpu") -> None:
        self.layout = layout
        shape = (layout.num_blocks, layout.block_size_tokens, layout.num_kv_heads, layout.head_dim)
        dtype = TORCH_KV_DTYPES[layout.kv_dtype]

        def scale() -> torch.Tensor | None:
            return torch.zeros(shape[:3], dtype=torch.float32, device=device) if layout.has_scales else None

        self.slots = [
            SlotTensors(
                k_cache=torch.zeros(shape, dtype=dtype, device=device),
                v_cache=torch.zeros(shape, dtype=dtype, device=device),
                k_scale=scale(),
                v_scale=scale(),
            )
            for _ in range(layout.slots_per_block)
        ]

    def for_layer(self, layer_idx: int) -> SlotTensors:
        return self.slots[self.layout.layer_locations[layer_idx].slot]

    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.slots for t in s.tensors())
