"""The engine's device-side prefix cache: finished requests' KV kept in the paged cache.

When a request ends, its block tables are not freed but kept here, indexed by the chained block
hashes (services/common/prefix_hash.py) of its computed tokens. The next turn of the dialogue, whose
prompt begins with exactly those tokens, *adopts* the tables and computes only what is new. A
regeneration or an edit of the last message matches a shorter prefix and adopts the tables cut to
it. Entries are owned by no request, and are reclaimed (least recently used first) whenever the
block pool runs short, so caching never refuses work that would otherwise fit.

A match at block k (tokens [0, kB)) is *usable* when every group holds what a continuation from kB
needs: a global group all blocks [0, k), a sliding group of window W the blocks covering
[kB - W + 1, kB). An entry is taken whole (one request at a time owns blocks); a second request
for the same prefix meanwhile falls back to the kvstore.

The event loop peeks (`peek_usable_tokens`) to decide whether the kvstore is worth asking; the
engine thread takes. A lock makes the peek safe; the engine thread is the only writer.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.prefix_hash import BlockHash
from services.engine.block_manager import BlockTable, KVCacheManager


@dataclass(eq=False)
class CachedPrefix:
    namespace: bytes
    # Tokens whose KV the tables hold, in order (the request's computed tokens).
    token_ids: list[int]
    tables: list[BlockTable]
    hashes: list[BlockHash]

    def num_blocks_held(self) -> int:
        return sum(b is not None for t in self.tables for b in t)


@dataclass(frozen=True)
class PrefixHit:
    entry: CachedPrefix
    num_tokens: int


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

    def _usable(self, entry: CachedPrefix, num_blocks: int) -> bool:
        bs = self.layout.block_size_tokens
        for group, table in zip(self.layout.groups, entry.tables):
            first = 0
            if group.sliding_window_tokens is not None:
                first = max(0, num_blocks * bs - group.sliding_window_tokens + 1) // bs
            if len(table) < num_blocks or any(table[i] is None for i in range(first, num_blocks)):
                return False
        return True

    def _find(self, hashes: Sequence[BlockHash], token_ids: Sequence[int], max_blocks: int) -> PrefixHit | None:
        bs = self.layout.block_size_tokens
        for k in range(min(len(hashes), max_blocks), 0, -1):
            holders = self._by_hash.get(hashes[k - 1])
            if not holders:
                continue
            entry = holders[-1]
            # Verify against the stored tokens: a hash collision must never hand out wrong KV.
            if list(token_ids[:k * bs]) != entry.token_ids[:k * bs]:
                continue
            if self._usable(entry, k):
                return PrefixHit(entry, k * bs)
        return None

    def peek_usable_tokens(self, hashes: Sequence[BlockHash], token_ids: Sequence[int], max_tokens: int) -> int:
        """How many tokens `take` would give now (any thread; a hint, the engine thread decides)."""
        with self._lock:
            hit = self._find(hashes, token_ids, max_tokens // self.layout.block_size_tokens)
        return 0 if hit is None else hit.num_tokens

    # ---- commands (engine thread) ---------------------------------------------------------------
    def take(self, hashes: Sequence[BlockHash], token_ids: Sequence[int], max_tokens: int
             ) -> tuple[list[BlockTable], int] | None:
        """Remove the best usable entry and return its tables cut to the match, and the match length."""
        with self._lock:
            hit = self._find(hashes, token_ids, max_tokens // self.layout.block_size_tokens)
            if hit is None:
                return None
            self._remove(hit.entry)
        num_blocks = hit.num_tokens // self.layout.block_size_tokens
        tables = hit.entry.tables
        tail = [t[num_blocks:] for t in tables]
        self.kv.free_tables(tail)
        return [t[:num_blocks] for t in tables], hit.num_tokens

    def insert(self, namespace: bytes, token_ids: list[int], tables: list[BlockTable],
               hashes: Sequence[BlockHash]) -> None:
        """Keep a finished request's tables (this cache now owns the blocks)."""
        entry = CachedPrefix(namespace, token_ids, tables, list(hashes))
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

    def _remove(self, entry: CachedPrefix) -> None:
        del self._entries[id(entry)]
        self._num_blocks -= entry.num_blocks_held()
        for h in entry.hashes:
            holders = self._by_hash[h]
            holders.remove(entry)
            if not holders:
                del self._by_hash[h]
