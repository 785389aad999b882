"""Copying a running request's prompt KV to a request that repeats its prompt (the other choices of
an n > 1 completion), so the shared prompt is prefilled once.

The device prefix cache (device_cache.py) hands an entry to one request at a time and holds only
finished requests' blocks, so choices running side by side cannot share it. Instead the second
choice gets a copy: the parent's whole blocks of the common prefix are packed (kv_transfer.pack_blocks)
into the same payload a kvstore hit carries, and written into the child's fresh blocks at its first
step. The child computes only the tokens after the last whole block (at most one block, and at least
the prompt's last token, whose logits give its first token).

    parent tables  [b0 b1 b2 b3 ...]         (running; prompt computed through block 3)
    child prompt   [ same tokens  ][tail]    -> PrefixHit(4 x BS tokens, DEVICE, payload of b0..b3)

A copy is offered only when it is usable by the rule every hit follows: the global groups hold all
blocks of the prefix and each sliding group the blocks its window needs before the prefix's end.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from salon.engine.batch import HostKV
from salon.engine.kv.kv_cache import KVCache
from salon.engine.kv.kv_layout import BlockTable
from salon.engine.kv.kv_transfer import GLOBAL, LOCAL, local_start_block, pack_blocks
from salon.engine.prefix.hit import CacheSource, PrefixHit, cacheable_prefix_tokens
from salon.engine.request import Request


def _usable(cache: KVCache, tables: Sequence[BlockTable], num_blocks: int) -> bool:
    bs = cache.layout.block_size_tokens
    for group, table in zip(cache.layout.groups, tables):
        first = 0
        if group.sliding_window_tokens is not None:
            first = max(0, num_blocks * bs - group.sliding_window_tokens + 1) // bs
        if len(table) < num_blocks or any(table[i] is None for i in range(first, num_blocks)):
            return False
    return True


def fork_hit(cache: KVCache, parent_tables: Sequence[BlockTable], parent: Request, child: Request) -> PrefixHit | None:
    """A hit for `child` carrying a copy of `parent`'s KV of their common whole blocks, or None when the
    parent has not computed them (still queued or prefilling), the tokens differ, or the KV is not usable."""
    if parent.namespace != child.namespace:
        return None  # never share KV across cache namespaces (tenants)
    bs = cache.layout.block_size_tokens
    num_tokens = min(cacheable_prefix_tokens(child.num_tokens, bs), parent.num_computed_tokens // bs * bs)
    num_blocks = num_tokens // bs
    if num_blocks == 0 or parent.token_slice(0, num_tokens) != child.token_slice(0, num_tokens):
        return None
    if not _usable(cache, parent_tables, num_blocks):
        return None
    local_first = local_start_block(cache.layout, parent_tables, num_blocks)
    global_kv = pack_blocks(cache, parent_tables, range(num_blocks), GLOBAL, to_host=False)
    local_kv = (
        pack_blocks(cache, parent_tables, range(local_first, num_blocks), LOCAL, to_host=False)
        if local_first < num_blocks
        else torch.empty((0, 0), dtype=torch.uint8)
    )
    return PrefixHit(num_tokens, CacheSource.DEVICE, host_kv=HostKV(global_kv, local_kv, local_first))
