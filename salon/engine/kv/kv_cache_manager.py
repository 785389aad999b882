"""Block accounting of the paged KV cache: block ids only, never tensors.

KVCacheManager keeps, per request and per KV cache group, the block table: entry i holds the block
with token positions [i*BS, (i+1)*BS), or None once a sliding group has released it. Block ids come
from one BlockPool (block_pool.py) shared by every group.

A request's computed tokens grow from 0 to its length in steps (prefill chunks, then one token per
decode). Before a step that computes tokens starting at position c, a group with window W releases
the blocks wholly before c - W + 1: no query at position >= c can see them any more. So a sliding
group holds at most ceil((W - 1 + chunk) / BS) + 1 blocks per request whatever the context length,
while a global group holds ceil(num_tokens / BS). `free(request_id)` returns everything at once.

Prefix caching (prefix/device_cache.py) moves whole block tables in and out: `detach` hands a finished
request's tables to the cache without freeing them, `adopt` gives cached tables to a new request
whose prompt extends them. Blocks held by the cache are *reclaimable*: when the pool is short,
`allocate_slots` asks the `reclaimer` to free some before it reports failure. A request may also
*retain* its sliding-window blocks from a position on (`set_retention`), so that the KV around its
last message survives for the cross-turn cache (regenerating or editing that message reuses it).
"""

from __future__ import annotations

from typing import Protocol

from salon.engine.kv.block_pool import BlockPool
from salon.engine.kv.kv_layout import BlockTable, KVCacheLayout


class Reclaimer(Protocol):
    """Holds blocks that can be given back on demand (the device prefix cache)."""

    def num_reclaimable_blocks(self) -> int: ...

    def reclaim(self, num_blocks: int) -> int:
        """Free at least num_blocks blocks if it can; return how many it freed."""
        ...


class KVCacheManager:
    def __init__(self, layout: KVCacheLayout) -> None:
        self.layout = layout
        self.pool = BlockPool(layout.num_blocks)
        # request id -> one block table per group (indexed by group id)
        self._tables: dict[str, list[BlockTable]] = {}
        # request id -> position from which sliding-window blocks are kept (not released)
        self._retain_from: dict[str, int] = {}
        self.reclaimer: Reclaimer | None = None

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_reclaimable_blocks(self) -> int:
        return self.reclaimer.num_reclaimable_blocks() if self.reclaimer is not None else 0

    def has_blocks(self, request_id: str) -> bool:
        return request_id in self._tables

    def _first_needed(self, request_id: str, num_computed_tokens: int) -> list[int]:
        """Per group, the first block index it must keep before computing from num_computed_tokens
        (0 for global groups; sliding groups release what their window no longer sees)."""
        bs = self.layout.block_size_tokens
        retain = self._retain_from.get(request_id)
        out = []
        for group in self.layout.groups:
            window = group.sliding_window_tokens
            first = 0 if window is None else max(0, num_computed_tokens - window + 1) // bs
            out.append(first if retain is None or window is None else min(first, retain // bs))
        return out

    def block_tables(self, request_id: str) -> list[BlockTable]:
        return self._tables[request_id]

    def num_held_blocks(self, request_id: str) -> int:
        tables = self._tables.get(request_id, [])
        return sum(b is not None for t in tables for b in t)

    def _plan(
        self, request_id: str, num_computed_tokens: int, num_new_tokens: int
    ) -> tuple[list[int], list[list[int]], int]:
        """Per group: the first needed block index and the table indices to release; and the number of
        new blocks needed."""
        tables = self._tables.get(request_id) or [[] for _ in self.layout.groups]
        end_blocks = self.layout.blocks_for_tokens(num_computed_tokens + num_new_tokens)
        first_needed = self._first_needed(request_id, num_computed_tokens)
        releases: list[list[int]] = []
        num_new = 0
        for first, table in zip(first_needed, tables):
            releases.append([i for i in range(min(first, len(table))) if table[i] is not None])
            # Blocks wholly before the window are never allocated (None), e.g. after a prefix hit.
            num_new += max(0, end_blocks - max(len(table), first))
        return first_needed, releases, num_new

    def num_blocks_needed(self, request_id: str, num_computed_tokens: int, num_new_tokens: int) -> int:
        """New blocks minus released ones that computing the next tokens takes (may be negative)."""
        _, releases, num_new = self._plan(request_id, num_computed_tokens, num_new_tokens)
        return num_new - sum(len(r) for r in releases)

    def can_allocate(self, request_id: str, num_computed_tokens: int, num_new_tokens: int) -> bool:
        needed = self.num_blocks_needed(request_id, num_computed_tokens, num_new_tokens)
        return needed <= self.num_free_blocks + self.num_reclaimable_blocks

    def max_blocks_for_tokens(self, num_tokens: int, chunk_tokens: int) -> int:
        """Most blocks one request of num_tokens tokens can hold at once (admission upper bound)."""
        total = 0
        for group in self.layout.groups:
            if group.sliding_window_tokens is None:
                total += self.layout.blocks_for_tokens(num_tokens)
            else:
                live = group.sliding_window_tokens - 1 + chunk_tokens
                total += min(self.layout.blocks_for_tokens(num_tokens), self.layout.blocks_for_tokens(live) + 1)
        return total

    # ---- commands ------------------------------------------------------------------------------
    def allocate_slots(self, request_id: str, num_computed_tokens: int, num_new_tokens: int) -> bool:
        """Make room for tokens [num_computed_tokens, +num_new_tokens); release out-of-window blocks.

        All or nothing: returns False (and changes nothing) when the pool is short.
        """
        first_needed, releases, num_new = self._plan(request_id, num_computed_tokens, num_new_tokens)
        shortfall = num_new - sum(len(r) for r in releases) - self.num_free_blocks
        if shortfall > 0 and self.reclaimer is not None:
            self.reclaimer.reclaim(shortfall)
            shortfall = num_new - sum(len(r) for r in releases) - self.num_free_blocks
        if shortfall > 0:
            return False
        tables = self._tables.setdefault(request_id, [[] for _ in self.layout.groups])
        end_blocks = self.layout.blocks_for_tokens(num_computed_tokens + num_new_tokens)
        for table, release in zip(tables, releases):  # every release first: the new blocks may need them
            self.pool.free(table[i] for i in release)
            for i in release:
                table[i] = None
        for first, table in zip(first_needed, tables):
            while len(table) < min(first, end_blocks):
                table.append(None)
            missing = end_blocks - len(table)
            if missing > 0:
                table.extend(self.pool.allocate(missing))
        return True

    def truncate(self, request_id: str, num_tokens: int) -> int:
        """Return the blocks past the first num_tokens tokens (KV of rejected draft tokens) to the pool;
        the number of blocks freed."""
        keep = self.layout.blocks_for_tokens(num_tokens)
        freed = 0
        for table in self._tables.get(request_id, []):
            tail = [b for b in table[keep:] if b is not None]
            self.pool.free(tail)
            freed += len(tail)
            del table[keep:]
        return freed

    def set_retention(self, request_id: str, position: int | None) -> None:
        """Keep the request's sliding-window blocks from `position` on (None: release as usual)."""
        if position is None:
            self._retain_from.pop(request_id, None)
        else:
            self._retain_from[request_id] = max(0, position)

    def adopt(self, request_id: str, tables: list[BlockTable]) -> None:
        """Give a request (which holds nothing) block tables that the caller owned."""
        if request_id in self._tables:
            raise RuntimeError(f"request {request_id!r} already holds blocks")
        if len(tables) != len(self.layout.groups):
            raise ValueError(f"{len(tables)} block tables for {len(self.layout.groups)} groups")
        self._tables[request_id] = tables

    def detach(self, request_id: str) -> list[BlockTable] | None:
        """Take the request's block tables away without freeing them: the caller now owns the blocks."""
        self._retain_from.pop(request_id, None)
        return self._tables.pop(request_id, None)

    def free_tables(self, tables: list[BlockTable]) -> int:
        """Return the blocks of detached tables to the pool; the number of blocks freed."""
        held = [b for t in tables for b in t if b is not None]
        # Tail blocks first: the most recently written context is the least likely to be shared.
        self.pool.free(reversed(held))
        return len(held)

    def free(self, request_id: str) -> int:
        """Return every block of the request to the pool; the number of blocks freed."""
        tables = self.detach(request_id)
        return 0 if tables is None else self.free_tables(tables)
