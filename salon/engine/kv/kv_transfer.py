"""Moving a request's KV between the paged cache and host-cache payloads (the kvstore's unit).

The kvstore stores, per block of 16 tokens, two opaque payloads: *global* (the KV of every global-
attention layer: every block of a context needs it) and *local* (the KV of every sliding-window
layer: only the blocks inside the window before a match point need it). This module defines what
those bytes are, so that any engine with the same layout reads what another one wrote:

    payload(block b, part) = for each KV cache group of that part, in group order:
                               for each of its layers, in slot order:
                                 K [BS, Hkv, D] ‖ V [BS, Hkv, D] ‖ K scale f32[BS, Hkv] ‖ V scale f32[BS, Hkv]
                                 (values in the layout's kv_dtype; the scales of int8 caches only)

Packing gathers the rows of many blocks at once (one index per tensor) into a uint8 matrix whose
row i is block i's payload; unpacking scatters such a matrix back into freshly allocated blocks.
The layout tag names everything that decides these bytes, and goes into the cache namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from salon.common.kvstore_contract.layout import KVLayout
from salon.engine.kv.kv_cache import KVCache
from salon.engine.kv.kv_layout import BlockId, KVCacheGroup, KVCacheLayout

GLOBAL = "global"
LOCAL = "local"


def _groups(layout: KVCacheLayout, part: str) -> list[KVCacheGroup]:
    want_sliding = part == LOCAL
    return [g for g in layout.groups if (g.sliding_window_tokens is not None) == want_sliding]


def host_layout(layout: KVCacheLayout) -> KVLayout:
    """The kvstore's view of our KV (salon/common/kvstore_contract/layout.py): payload sizes, sliding window."""
    per_layer = layout.bytes_per_layer_block
    windows = [g.sliding_window_tokens for g in _groups(layout, LOCAL)]
    return KVLayout(
        block_size_tokens=layout.block_size_tokens,
        global_bytes_per_block=per_layer * sum(len(g.layer_ids) for g in _groups(layout, GLOBAL)),
        local_bytes_per_block=per_layer * sum(len(g.layer_ids) for g in _groups(layout, LOCAL)),
        # A match point is usable when the widest window's KV is present (narrower ones are inside it).
        sliding_window_tokens=max(windows, default=0),
    )


def layout_tag(layout: KVCacheLayout, precision: str, family: str) -> str:
    """Everything that decides the payload bytes; part of the cache namespace. `family` names the kernels that
    compute the KV (EngineCore.kernel_family: the family of salon/kernels/backend.py, cpu, triton or ref, and its
    build where builds differ, as "cpu-avx512"): their KV differs in bits, so engines of different kernels never
    share cache entries."""
    groups = ";".join(
        f"{'g' if g.sliding_window_tokens is None else 'w' + str(g.sliding_window_tokens)}:"
        + ",".join(map(str, g.layer_ids))
        for g in layout.groups
    )
    return (
        f"kv-{layout.kv_dtype}-v1/bs{layout.block_size_tokens}/hkv{layout.num_kv_heads}/d{layout.head_dim}/"
        f"{precision}/{family}/{groups}"
    )


def _block_ids(
    tables: Sequence[Sequence[BlockId | None]], group: KVCacheGroup, block_indices: Sequence[int]
) -> torch.Tensor:
    table = tables[group.group_id]
    ids = []
    for i in block_indices:
        block = table[i] if i < len(table) else None
        if block is None:
            raise ValueError(f"group {group.group_id} holds no block at index {i}")
        ids.append(int(block))
    return torch.tensor(ids, dtype=torch.long)


def pack_blocks(
    cache: KVCache,
    tables: Sequence[Sequence[BlockId | None]],
    block_indices: Sequence[int],
    part: str,
    to_host: bool = True,
) -> torch.Tensor:
    """uint8[len(block_indices), bytes_per_block]: row i is the `part` payload of block block_indices[i];
    on the host, or where the cache is with to_host=False (a device-to-device copy, or for copy_to_host)."""
    columns: list[torch.Tensor] = []
    n = len(block_indices)
    for group in _groups(cache.layout, part):
        ids = _block_ids(tables, group, block_indices).to(cache.slots[0].k_cache.device)
        for slot in range(len(group.layer_ids)):
            tensors = cache.slots[slot]
            for t in tensors.tensors():
                columns.append(t.index_select(0, ids).reshape(n, -1).view(torch.uint8))
    if not columns:
        return torch.empty((n, 0), dtype=torch.uint8)
    packed = torch.cat(columns, dim=1)
    return packed.cpu() if to_host else packed


def copy_to_host(packed: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
    """(host tensor, wait): `packed` (from pack_blocks(..., to_host=False)) on the host. On CUDA the copy runs
    on a side stream into pinned memory, after the work already queued (the gather), without blocking the
    step; `wait()` blocks until the bytes are there (call it off the step thread). Elsewhere: (packed, None)."""
    if packed.device.type != "cuda":
        return packed, None
    side = _side_stream(packed.device)
    side.wait_stream(torch.cuda.current_stream(packed.device))
    host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
    with torch.cuda.stream(side):
        host.copy_(packed, non_blocking=True)
        packed.record_stream(side)  # the caching allocator keeps the gather alive until the copy ran
        done = torch.cuda.Event()
        done.record(side)
    return host, done.synchronize


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` in one copy: pinned and non-blocking on CUDA (the kernels that read it are
    queued behind the copy on the same stream); the tensor itself where it already is."""
    if host.device == device or device.type == "cpu" and host.device.type == "cpu":
        return host
    if device.type == "cuda" and host.device.type == "cpu":
        host = host if host.is_pinned() else host.pin_memory()
        return host.to(device, non_blocking=True)
    return host.to(device)


def unpack_blocks(
    cache: KVCache,
    tables: Sequence[Sequence[BlockId | None]],
    block_indices: Sequence[int],
    part: str,
    payloads: torch.Tensor,
) -> None:
    """Write payload rows (as made by pack_blocks) into the blocks the tables hold at block_indices."""
    n = len(block_indices)
    if payloads.dtype != torch.uint8 or payloads.dim() != 2 or payloads.shape[0] != n:
        raise ValueError(f"payloads must be uint8[{n}, bytes], got {payloads.dtype}{list(payloads.shape)}")
    offset = 0
    payloads = to_device(payloads, cache.slots[0].k_cache.device)
    for group in _groups(cache.layout, part):
        ids = _block_ids(tables, group, block_indices).to(cache.slots[0].k_cache.device)
        for slot in range(len(group.layer_ids)):
            tensors = cache.slots[slot]
            for t in tensors.tensors():
                row_bytes = t[0].numel() * t.element_size()
                chunk = payloads[:, offset : offset + row_bytes].contiguous().view(t.dtype).reshape(n, *t.shape[1:])
                t.index_copy_(0, ids, chunk)
                offset += row_bytes
    if offset != payloads.shape[1]:
        raise ValueError(f"payload rows have {payloads.shape[1]} bytes, the {part} layout needs {offset}")


def local_start_block(layout: KVCacheLayout, tables: Sequence[Sequence[BlockId | None]], num_blocks: int) -> int:
    """First block index from which every sliding group holds all blocks up to num_blocks."""
    start = 0
    for group in _groups(layout, LOCAL):
        table = tables[group.group_id]
        i = num_blocks
        while i > 0 and i - 1 < len(table) and table[i - 1] is not None:
            i -= 1
        start = max(start, i)
    return start
