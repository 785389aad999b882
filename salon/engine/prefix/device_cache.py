"""The engine's device-side prefix cache: finished requests' KV kept in the paged cache.

When a request ends, its block tables are not freed but kept here, indexed by the chained block
hashes (salon/common/prefix_hash.py) of its computed tokens. The next turn of the dialogue, whose
prompt begins with exactly those tokens, *adopts* the tables and computes only what is new. A
regeneration or an edit of the last message matches a shorter prefix and adopts the tables cut to
it. Entries are owned by no request, and are reclaimed (least recently used first) whenever the
block pool runs short, so caching never refuses work that would otherwise fit.

A match is found by block hashes, whole blocks [0, k) (tokens [0, kB)), and then runs on token by
token into the entry's block k while the entry's tokens and the request's agree: a hit of T = kB + j
tokens (0 <= j <= B; at most the request's length - 1, so at least its last token is computed). The
tokens that usually follow a turn -- the rest of the previous prompt's last block and the reply's first
tokens -- are then not computed again: on average half a block of every returning turn. The request
adopts block k as its own last block and writes its first new token at offset j: the entry is taken
whole, so no one else holds that block, and KV past j (the entry's own continuation) is overwritten
before any query can see it. A hit of T tokens is *usable* when every group holds what a continuation
from T needs: a global group all blocks [0, ceil(T/B)), a sliding group of window W the blocks
covering [T - W + 1, T). A second request for the same prefix meanwhile falls back to the kvstore.

`lookup` is a query (any thread: the servicer asks it to decide whether the kvstore is worth
asking); `take` is the engine thread's command that hands the hit's tables over. A lock makes the
lookup safe; the engine thread is the only writer.

Each entry remembers the conversation whose request left it, so `drop_conversation` can erase a
dialogue's KV (an entry that a later turn of another dialogue adopted belongs to that dialogue then).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from salon.common.prefix_hash import BlockHash
from salon.engine.kv.kv_layout import BlockTable
from salon.engine.prefix.hit import CachedPrefix, CacheSource, PrefixHit, cacheable_prefix_tokens

if TYPE_CHECKING:
    from salon.engine.kv.kv_cache_manager import KVCacheManager
    from salon.engine.request import Request


class DevicePrefixCache:
    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.layout = kv.layout
        # Block hash -> the entries whose prefix has that block, oldest first (the newest is tried).
        self._by_hash: dict[BlockHash, list[CachedPrefix]] = {}
        # id(entry) -> entry in insertion order: the first is the least recently inserted.
        self._entries: dict[int, CachedPrefix] = {}
        self._num_blocks = 0
        self._lock = threading.Lock()
        kv.reclaimer = self

    # ---- queries ---------------------------------------------------------------------------------
    @property
    def num_entries(self) -> int:
        return len(self._entries)

    def num_reclaimable_blocks(self) -> int:
        return self._num_blocks

    def _usable(self, entry: CachedPrefix, num_tokens: int) -> bool:
        bs = self.layout.block_size_tokens
        num_blocks = -(-num_tokens // bs)
        for group, table in zip(self.layout.groups, entry.tables):
            first = 0
            if group.sliding_window_tokens is not None:
                first = max(0, num_tokens - group.sliding_window_tokens + 1) // bs
            if len(table) < num_blocks or any(table[i] is None for i in range(first, num_blocks)):
                return False
        return True

    def _find(self, hashes: Sequence[BlockHash], token_ids: Sequence[int], max_blocks: int) -> PrefixHit | None:
        """The longest usable hit: whole blocks by hash (at most max_blocks), then on into the entry's next
        block while its tokens agree with token_ids (the most a hit may cover)."""
        bs = self.layout.block_size_tokens
        for k in range(min(len(hashes), max_blocks), 0, -1):
            holders = self._by_hash.get(hashes[k - 1])
            if not holders:
                continue
            entry = holders[-1]
            # Verify against the stored tokens: a hash collision must never hand out wrong KV.
            if list(token_ids[: k * bs]) != entry.token_ids[: k * bs]:
                continue
            n, end = k * bs, min(len(token_ids), len(entry.token_ids), (k + 1) * bs)
            while n < end and token_ids[n] == entry.token_ids[n]:
                n += 1
            if self._usable(entry, n):
                return PrefixHit(n, CacheSource.DEVICE, entry=entry)
        return None

    def lookup(self, request: Request) -> PrefixHit | None:
        """The longest usable cached prefix of the request's context (any thread; a hint off the engine
        thread, which alone decides)."""
        if request.namespace is None:
            return None
        bs = self.layout.block_size_tokens
        max_blocks = cacheable_prefix_tokens(request.num_tokens, bs) // bs
        hashes = request.block_hashes(max_blocks * bs, bs)
        with self._lock:
            return self._find(hashes, request.token_slice(0, request.num_tokens - 1), max_blocks)

    # ---- commands (engine thread) ---------------------------------------------------------------
    def take(self, hit: PrefixHit) -> list[BlockTable]:
        """Remove the hit's entry and return its tables cut to the hit's blocks, the one it ends inside
        included (the caller now owns them)."""
        entry = hit.entry
        if hit.source is not CacheSource.DEVICE or entry is None:
            raise ValueError("take() needs a device hit")
        with self._lock:
            if id(entry) not in self._entries:
                raise RuntimeError("the hit's cache entry is gone (taken or reclaimed since the lookup)")
            self._remove(entry)
        num_blocks = -(-hit.num_tokens // self.layout.block_size_tokens)  # with the block a hit ends inside
        self.kv.free_tables([t[num_blocks:] for t in entry.tables])
        return [t[:num_blocks] for t in entry.tables]

    def insert(
        self,
        namespace: bytes,
        token_ids: list[int],
        tables: list[BlockTable],
        hashes: Sequence[BlockHash],
        conversation_id: str = "",
    ) -> None:
        """Keep a finished request's tables (this cache now owns the blocks)."""
        entry = CachedPrefix(namespace, token_ids, tables, list(hashes), conversation_id)
        with self._lock:
            self._entries[id(entry)] = entry
            self._num_blocks += entry.num_blocks_held()
            for h in entry.hashes:
                self._by_hash.setdefault(h, []).append(entry)

    def reclaim(self, num_blocks: int) -> int:
        """Free least recently inserted entries until num_blocks blocks are freed (or none is left)."""
        freed = 0
        while freed < num_blocks and self._entries:
            with self._lock:
                oldest = next(iter(self._entries.values()))
                self._remove(oldest)
            freed += self.kv.free_tables(oldest.tables)
        return freed

    def clear(self) -> int:
        return self.reclaim(self._num_blocks + 1)

    def drop_conversation(self, namespace: bytes, conversation_id: str) -> int:
        """Free every entry a dialogue's requests left; returns the blocks freed."""
        with self._lock:
            doomed = [
                e for e in self._entries.values() if e.namespace == namespace and e.conversation_id == conversation_id
            ]
            for entry in doomed:
                self._remove(entry)
        return sum(self.kv.free_tables(entry.tables) for entry in doomed)

    def _remove(self, entry: CachedPrefix) -> None:
        del self._entries[id(entry)]
        self._num_blocks -= entry.num_blocks_held()
        for h in entry.hashes:
            holders = self._by_hash[h]
            holders.remove(entry)
            if not holders:
                del self._by_hash[h]
