"""How the paged KV cache is cut into groups, slots and blocks (the hybrid allocator's plan).

One block pool serves every layer. The KV-producing layers are split into *KV cache groups* of at
most `slots_per_block` layers with the same attention kind and window; each group has its own block
table per request, so a sliding-window group can drop blocks that a global group still needs.
A block id names one *page*: `slots_per_block` per-layer blocks, one in each slot tensor, and layer
i of a group lives in slot i (the vLLM v1 hybrid-allocator layout):

    slot tensor 0: [block 0][block 1][block 2] ...     k/v int8[num_blocks, BS, Hkv, D]
    slot tensor 1: [block 0][block 1][block 2] ...     + k/v scale f32[num_blocks, BS, Hkv]
                      ^ block 1 held by group g: layer g.layer_ids[0] uses slot 0, [1] uses slot 1

A block id is owned by at most one group of one request at a time, so the slots never collide.
Gemma 3 270M (3 global + 15 sliding layers): slots_per_block=3, groups = 1 global + 5 sliding.
Layers that read another layer's KV (kv_source_layer) map to their source's (group, slot) and own
nothing. Memory is exact: every block costs `page_bytes`, whatever group holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

from salon.engine.model.config import ModelConfig

# What a cache slot stores per (token, KV head): int8 values + one float32 scale, or plain floats.
KV_DTYPES = ("int8", "bfloat16", "float32")
_VALUE_BYTES = {"int8": 1, "bfloat16": 2, "float32": 4}
_SCALE_BYTES = {"int8": 4, "bfloat16": 0, "float32": 0}

BlockId = NewType("BlockId", int)
GroupId = NewType("GroupId", int)
# One request's blocks in one group: entry i holds token positions [i*BS, (i+1)*BS), or None once a
# sliding-window group has released that block (kv/kv_cache_manager.py).
BlockTable = list[BlockId | None]


@dataclass(frozen=True)
class KVCacheGroup:
    group_id: GroupId
    # KV-producing layers of this group; layer_ids[i] lives in slot tensor i.
    layer_ids: tuple[int, ...]
    # None for global attention: such a group keeps every block of the context.
    sliding_window_tokens: int | None


@dataclass(frozen=True)
class LayerLocation:
    group_id: GroupId
    slot: int
    sliding_window_tokens: int | None


@dataclass(frozen=True)
class KVCacheLayout:
    block_size_tokens: int
    num_blocks: int
    slots_per_block: int
    num_kv_heads: int
    head_dim: int
    groups: tuple[KVCacheGroup, ...]
    # Every model layer (sharing ones included) -> where its KV lives.
    layer_locations: tuple[LayerLocation, ...]
    # One of KV_DTYPES.
    kv_dtype: str = "int8"

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {self.kv_dtype!r}")

    @property
    def has_scales(self) -> bool:
        """int8 caches store one float32 scale per (token, KV head) beside K and V."""
        return _SCALE_BYTES[self.kv_dtype] > 0

    @property
    def bytes_per_layer_block(self) -> int:
        """K and V of every token of a block, plus (int8) a float32 scale per token per KV head for each."""
        per_token = 2 * self.num_kv_heads * (self.head_dim * _VALUE_BYTES[self.kv_dtype] + _SCALE_BYTES[self.kv_dtype])
        return self.block_size_tokens * per_token

    @property
    def page_bytes(self) -> int:
        return self.slots_per_block * self.bytes_per_layer_block

    @property
    def capacity_bytes(self) -> int:
        return self.num_blocks * self.page_bytes

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size_tokens)


def plan_groups(config: ModelConfig) -> tuple[int, tuple[KVCacheGroup, ...]]:
    """Split KV-producing layers into groups of equal attention; return (slots_per_block, groups).

    slots_per_block is the smallest per-kind layer count, so the smallest kind fills whole pages;
    a kind whose count is not a multiple leaves the tail slots of its last group unused.
    """
    by_kind: dict[int | None, list[int]] = {}
    for i in config.kv_layers():
        by_kind.setdefault(config.layers[i].sliding_window_tokens, []).append(i)
    slots = min(len(ids) for ids in by_kind.values())
    groups: list[KVCacheGroup] = []
    # Global first, then windows ascending: a stable, readable group order.
    for window in sorted(by_kind, key=lambda w: -1 if w is None else w):
        ids = by_kind[window]
        for start in range(0, len(ids), slots):
            groups.append(KVCacheGroup(GroupId(len(groups)), tuple(ids[start : start + slots]), window))
    return slots, tuple(groups)


def plan_layout(
    config: ModelConfig, block_size_tokens: int, capacity_bytes: int, kv_dtype: str = "int8"
) -> KVCacheLayout:
    """The layout with as many blocks as fit in capacity_bytes."""
    slots, groups = plan_groups(config)
    own: dict[int, LayerLocation] = {}
    for g in groups:
        for slot, layer in enumerate(g.layer_ids):
            own[layer] = LayerLocation(g.group_id, slot, g.sliding_window_tokens)
    locations = tuple(own[config.kv_source(i)] for i in range(config.num_layers))
    probe = KVCacheLayout(
        block_size_tokens, 0, slots, config.num_kv_heads, config.head_dim, groups, locations, kv_dtype
    )
    num_blocks = capacity_bytes // probe.page_bytes
    if num_blocks < 1:
        raise ValueError(f"kv_cache_bytes={capacity_bytes} holds no block of {probe.page_bytes} bytes")
    return KVCacheLayout(
        block_size_tokens, num_blocks, slots, config.num_kv_heads, config.head_dim, groups, locations, kv_dtype
    )
