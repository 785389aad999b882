"""A prefix-cache hit as a query result: how much of a request's context need not be computed,
and where that KV comes from.

Both caches answer a lookup with a PrefixHit (or None):

    device  prefix/device_cache.py: a finished request's block tables, still in the paged cache; the
            request adopts them (cut to the hit) and computes from hit.num_tokens on
    host    prefix/host_cache.py: KV fetched from the kvstore before admission; the request gets fresh
            blocks for it, written at its first step (kv_transfer.unpack_blocks)

The scheduler asks for the hit when it admits a request (before allocating its slots) and is handed
it explicitly: nothing rewrites a request's progress behind the scheduler's back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from salon.common.prefix_hash import BlockHash
from salon.engine.batch import HostKV
from salon.engine.kv.kv_layout import BlockTable


@dataclass(eq=False)
class CachedPrefix:
    """A device cache entry (prefix/device_cache.py): a finished request's computed tokens and the block
    tables that hold their KV."""

    namespace: bytes
    # Tokens whose KV the tables hold, in order (the request's computed tokens).
    token_ids: list[int]
    tables: list[BlockTable]
    hashes: list[BlockHash]
    # The dialogue whose request left these blocks (for drop_conversation); "" if none was given.
    conversation_id: str = ""

    def num_blocks_held(self) -> int:
        return sum(b is not None for t in self.tables for b in t)


class CacheSource(enum.Enum):
    DEVICE = "device"
    HOST = "host"


@dataclass(frozen=True)
class PrefixHit:
    """The first num_tokens tokens of a request's context are cached: a whole number of blocks from the host;
    from the device, whole blocks and then as many tokens of the next block as the entry shares with the
    request (prefix/device_cache.py)."""

    num_tokens: int
    source: CacheSource
    # DEVICE: the cache entry whose block tables the request adopts, cut to num_tokens.
    entry: CachedPrefix | None = None
    # HOST: the fetched KV, written into the request's fresh blocks at its first step.
    host_kv: HostKV | None = None


def host_hit(num_tokens: int, global_kv: torch.Tensor, local_kv: torch.Tensor, local_first_block: int) -> PrefixHit:
    return PrefixHit(num_tokens, CacheSource.HOST, host_kv=HostKV(global_kv, local_kv, local_first_block))


def cacheable_prefix_tokens(num_tokens: int, block_size_tokens: int) -> int:
    """The longest prefix of a num_tokens context a cache hit may cover: whole blocks, and at least the
    last token left to compute (its logits give the next token)."""
    return (num_tokens - 1) // block_size_tokens * block_size_tokens


def better_hit(a: PrefixHit | None, b: PrefixHit | None) -> PrefixHit | None:
    """The longer hit; the first one on a tie (callers pass the device hit first: nothing to copy)."""
    if a is None:
        return b
    if b is None or a.num_tokens >= b.num_tokens:
        return a
    return b
