"""The kvstore's domain API: the radix tree, the arena that holds its bytes, and leases.

Everything here runs on the service's single asyncio thread and never awaits, so each call is one
short critical section: a reader never sees a half-written block (a block's bytes are copied into
its extent before the node is linked), and nothing can be evicted while pinned.

Shared-memory transfer:
  fetch   begin_fetch pins the usable path; a lease keeps it pinned until release_lease or the
          lease's TTL, and the engine reads the blocks' extents directly (and discards what it read
          if its lease ended meanwhile).
  put     prepare_shared_put reserves extents for the blocks the store lacks (zeroed, and the
          existing path pinned); the engine writes them and calls commit_shared_put, which links
          the blocks that are still missing and frees the rest. The servicer first checks every
          slot's bytes against the engine's checksums (put_slots), so a slot that was never written
          is never linked.

The store never returns bytes it did not write:
  * free arena bytes are zero (the tree zeroes every extent it frees; prepared slots are zeroed
    again), so unwritten space never holds another namespace's KV;
  * an expired put lease's extents are quarantined for one lease TTL before they can be reused: an
    engine checks its lease's remaining time before it writes, so a late write lands in quarantined
    space, never in a block that another namespace owns by then;
  * each peer holds at most max_leases_per_peer leases (LeaseLimit), so no caller can pin or
    reserve the whole arena.
"""

from __future__ import annotations

import secrets
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from salon.common.kvstore_contract.layout import KVLayout, MatchResult
from salon.kvstore.allocator import Extent
from salon.kvstore.arena import Arena
from salon.kvstore.radix_tree import Node, RadixTree

LeaseId = str


class LeaseLimit(Exception):
    """The peer already holds max_leases_per_peer leases."""


@dataclass(frozen=True)
class FetchPlan:
    """A pinned usable prefix: blocks [0, len(nodes)); local KV for blocks >= local_from_block."""

    num_tokens: int
    nodes: list[Node]
    local_from_block: int


@dataclass
class PutCounts:
    stored_blocks: int = 0
    existing_blocks: int = 0
    skipped_blocks: int = 0
    evicted_blocks: int = 0
    stored_bytes: int = 0  # KV bytes newly stored (global and local)


@dataclass(frozen=True)
class PutSlot:
    """Where the engine writes one block of a shared-memory put (None: the store has it)."""

    block_index: int
    global_extent: Extent | None
    local_extent: Extent | None


@dataclass
class _PreparedPut:
    namespace: bytes
    layout: KVLayout
    token_bytes: bytes
    owner: str
    existing: list[Node]  # pinned
    slots: list[PutSlot]
    counts: PutCounts


@dataclass
class _Lease:
    expires_at_s: float
    peer: str
    fetch: FetchPlan | None = None
    put: _PreparedPut | None = None


@dataclass
class StoreCounters:
    query_tokens: int = 0
    matched_tokens: int = 0
    hit_tokens: int = 0
    fetch_bytes: int = 0
    put_bytes: int = 0
    expired_leases: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class KVStore:
    def __init__(
        self,
        tree: RadixTree,
        arena: Arena,
        lease_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_leases_per_peer: int = 256,
    ):
        self.tree = tree
        self.arena = arena
        self.lease_ttl_s = lease_ttl_s
        self.max_leases_per_peer = max_leases_per_peer
        self.counters = StoreCounters()
        self._clock = clock
        self._leases: dict[LeaseId, _Lease] = {}
        self._leases_by_peer: dict[str, int] = {}
        # (reusable from, extents) of expired put leases, oldest first; their bytes stay reserved.
        self._quarantine: deque[tuple[float, list[Extent]]] = deque()
        self.quarantined_bytes = 0

    # ---- match and fetch -----------------------------------------------------------------------

    def match(self, namespace: bytes, layout: KVLayout, token_bytes: bytes) -> MatchResult:
        result = self.tree.match(namespace, layout, token_bytes)
        self.counters.query_tokens += len(token_bytes) // 4
        self.counters.matched_tokens += result.matched_tokens
        self.counters.hit_tokens += result.usable_tokens
        return result

    def begin_fetch(self, namespace: bytes, layout: KVLayout, token_bytes: bytes, max_tokens: int) -> FetchPlan:
        """Pin and touch the longest usable prefix of at most max_tokens tokens (0: no limit)."""
        num_blocks = len(token_bytes) // layout.block_key_bytes
        if max_tokens:
            num_blocks = min(num_blocks, max_tokens // layout.block_size_tokens)
        path = self.tree.usable_path(namespace, layout, token_bytes, num_blocks)
        local_from = len(path) - layout.needed_local_blocks(len(path))
        self.tree.pin(path)
        self.tree.touch(path, path[local_from:])
        return FetchPlan(len(path) * layout.block_size_tokens, path, local_from)

    def end_fetch(self, plan: FetchPlan) -> None:
        self.tree.unpin(plan.nodes)

    def lease_fetch(self, plan: FetchPlan, peer: str = "") -> LeaseId:
        """Keep a fetch plan pinned under a lease (shared-memory fetch); check_lease_room(peer) first."""
        return self._new_lease(_Lease(self._clock() + self.lease_ttl_s, peer, fetch=plan))

    def check_lease_room(self, peer: str) -> None:
        """LeaseLimit if `peer` may not take another lease."""
        if self._leases_by_peer.get(peer, 0) >= self.max_leases_per_peer:
            raise LeaseLimit(f"{peer} already holds {self.max_leases_per_peer} shared-memory leases")

    # ---- put over gRPC -------------------------------------------------------------------------

    def begin_put(self, namespace: bytes, layout: KVLayout, token_bytes: bytes, owner: str) -> PutSession:
        return PutSession(self, namespace, layout, token_bytes, owner)

    # ---- put over shared memory ----------------------------------------------------------------

    def prepare_shared_put(
        self,
        namespace: bytes,
        layout: KVLayout,
        token_bytes: bytes,
        owner: str,
        num_blocks: int,
        local_blocks: frozenset[int],
        first_block: int = 0,
        peer: str = "",
    ) -> tuple[LeaseId, list[PutSlot], int]:
        """Reserve zeroed extents for the blocks of [0, num_blocks) the store lacks (global KV, and
        local KV for blocks in local_blocks). The engine has global KV only for blocks >= first_block:
        a missing block below it means nothing more is reserved. Returns (lease, slots to write,
        blocks already stored). Stops at the first block it cannot make room for. LeaseLimit (nothing
        reserved) when `peer` holds too many leases."""
        self.check_lease_room(peer)
        tree = self.tree
        ns = tree.get_or_create_namespace(namespace, layout)
        existing = tree.existing_path(ns.root, token_bytes, num_blocks)
        tree.pin(existing)  # before allocating: allocation may evict
        slots: list[PutSlot] = []
        for node in existing:
            if node.block_index in local_blocks and node.local_extent is None:
                extent = tree.allocate(layout.local_bytes_per_block)
                if extent is not None:
                    slots.append(PutSlot(node.block_index, None, extent))
        for index in range(len(existing), num_blocks if len(existing) >= first_block else 0):
            g = tree.allocate(layout.global_bytes_per_block)
            if g is None:
                break
            loc = tree.allocate(layout.local_bytes_per_block) if index in local_blocks else None
            slots.append(PutSlot(index, g, loc))
        for slot in slots:
            for extent in (slot.global_extent, slot.local_extent):
                if extent is not None:
                    self.arena.zero(extent)
        counts = PutCounts(existing_blocks=len(existing))
        prepared = _PreparedPut(namespace, layout, token_bytes, owner, existing, slots, counts)
        return self._new_lease(_Lease(self._clock() + self.lease_ttl_s, peer, put=prepared)), slots, len(existing)

    def put_slots(self, lease_id: LeaseId) -> list[PutSlot] | None:
        """The slots of a prepared put (a query: to check what the engine wrote); None if unknown."""
        lease = self._leases.get(lease_id)
        return None if lease is None or lease.put is None else lease.put.slots

    def commit_shared_put(self, lease_id: LeaseId) -> PutCounts | None:
        """Link the written blocks (the caller has checked them against the engine's checksums);
        None if the lease is unknown or expired (nothing stored)."""
        lease = self._pop_lease(lease_id)
        if lease is None or lease.put is None:
            if lease is not None:
                self._end(lease)
            return None
        prep = lease.put
        tree = self.tree
        counts = prep.counts
        kb = prep.layout.block_key_bytes
        path = list(prep.existing)
        local_nodes: list[Node] = []
        ok = all(not n.detached for n in prep.existing)
        ns = tree.namespace(prep.namespace, prep.layout)
        ok = ok and ns is not None and not ns.root.detached
        cursor = prep.existing[-1] if prep.existing else (ns.root if ns is not None else None)
        for slot in prep.slots:
            if not ok:
                _free_slot(tree, slot)
                counts.skipped_blocks += slot.global_extent is not None
                continue
            if slot.global_extent is None:  # local KV for a block that was already stored
                node = prep.existing[slot.block_index]
                counts.stored_bytes += self._attach_or_free(node, slot.local_extent, local_nodes)
                continue
            key = prep.token_bytes[slot.block_index * kb : (slot.block_index + 1) * kb]
            node = cursor.children.get(key)
            if node is None:
                node = tree.insert(cursor, key, slot.global_extent, None, prep.owner)
                counts.stored_blocks += 1
                counts.stored_bytes += slot.global_extent.length
            else:  # stored meanwhile by another put
                tree.free_reserved(slot.global_extent)
                tree.add_owner(node, prep.owner)
                counts.existing_blocks += 1
            if slot.local_extent is not None:
                counts.stored_bytes += self._attach_or_free(node, slot.local_extent, local_nodes)
            path.append(node)
            cursor = node
        if ok:
            for node in prep.existing:
                tree.add_owner(node, prep.owner)
            tree.touch(path, local_nodes)
            self.counters.put_bytes += counts.stored_bytes
        tree.unpin(prep.existing)
        return counts

    # ---- leases --------------------------------------------------------------------------------

    def release_lease(self, lease_id: LeaseId) -> bool:
        """End a lease at its holder's word (it is done reading or writing): space is free at once."""
        lease = self._pop_lease(lease_id)
        if lease is None:
            return False
        self._end(lease)
        return True

    def expire_leases(self) -> int:
        """End the leases past their TTL; an expired put's space goes to quarantine, not back to use."""
        now = self._clock()
        expired = [lid for lid, lease in self._leases.items() if lease.expires_at_s <= now]
        for lid in expired:
            self._end(self._pop_lease(lid), quarantine_until_s=now + self.lease_ttl_s)
        self.counters.expired_leases += len(expired)
        return len(expired)

    def release_quarantine(self) -> int:
        """Free quarantined extents whose time is up; returns how many."""
        now, freed = self._clock(), 0
        while self._quarantine and self._quarantine[0][0] <= now:
            _, extents = self._quarantine.popleft()
            for extent in extents:
                self.quarantined_bytes -= extent.length
                self.tree.free_reserved(extent)
            freed += len(extents)
        return freed

    @property
    def num_leases(self) -> int:
        return len(self._leases)

    def num_leases_of(self, peer: str) -> int:
        return self._leases_by_peer.get(peer, 0)

    def close(self) -> None:
        for lid in list(self._leases):
            self._end(self._pop_lease(lid))
        while self._quarantine:
            for extent in self._quarantine.popleft()[1]:
                self.quarantined_bytes -= extent.length
                self.tree.free_reserved(extent)

    # ---- drop ----------------------------------------------------------------------------------

    def drop(self, namespace: bytes, conversation_id: str) -> int:
        if conversation_id:
            return self.tree.drop_conversation(namespace, conversation_id)
        return self.tree.drop_namespace(namespace)

    # ---- internals -----------------------------------------------------------------------------

    def _new_lease(self, lease: _Lease) -> LeaseId:
        lease_id = secrets.token_hex(12)
        self._leases[lease_id] = lease
        self._leases_by_peer[lease.peer] = self._leases_by_peer.get(lease.peer, 0) + 1
        return lease_id

    def _pop_lease(self, lease_id: LeaseId) -> _Lease | None:
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            left = self._leases_by_peer[lease.peer] - 1
            if left:
                self._leases_by_peer[lease.peer] = left
            else:
                del self._leases_by_peer[lease.peer]
        return lease

    def _end(self, lease: _Lease, quarantine_until_s: float | None = None) -> None:
        if lease.fetch is not None:
            self.end_fetch(lease.fetch)
        if lease.put is not None:
            if quarantine_until_s is None:
                for slot in lease.put.slots:
                    _free_slot(self.tree, slot)
            else:
                extents = [
                    e for slot in lease.put.slots for e in (slot.global_extent, slot.local_extent) if e is not None
                ]
                self.quarantined_bytes += sum(e.length for e in extents)
                self._quarantine.append((quarantine_until_s, extents))
            self.tree.unpin(lease.put.existing)

    def _attach_or_free(self, node: Node, extent: Extent, local_nodes: list[Node]) -> int:
        """Give `node` the local KV written at `extent` unless it has some; returns bytes stored."""
        local_nodes.append(node)
        if node.local_extent is None and not node.detached:
            self.tree.attach_local(node, extent)
            return extent.length
        self.tree.free_reserved(extent)
        return 0


def unwritten_slot(arena: Arena, slots: list[PutSlot], global_crc32: list[int], local_crc32: list[int]) -> str | None:
    """What is wrong with a prepared put's slots given the engine's checksums (None: all written).

    Reads only the slots' extents, which the lease owns, so it may run in a worker thread."""
    g_slots = [s for s in slots if s.global_extent is not None]
    l_slots = [s for s in slots if s.local_extent is not None]
    if len(global_crc32) != len(g_slots) or len(local_crc32) != len(l_slots):
        return (
            f"global_crc32 / local_crc32: {len(global_crc32)} / {len(local_crc32)} checksums for "
            f"{len(g_slots)} / {len(l_slots)} written slots"
        )
    for kind, chosen, sums in (("global", g_slots, global_crc32), ("local", l_slots, local_crc32)):
        for slot, expected in zip(chosen, sums):
            extent = slot.global_extent if kind == "global" else slot.local_extent
            if zlib.crc32(arena.read(extent)) != expected:
                return f"block {slot.block_index}: the {kind} KV at offset {extent.offset} is not what was written"
    return None


def _free_slot(tree: RadixTree, slot: PutSlot) -> None:
    for extent in (slot.global_extent, slot.local_extent):
        if extent is not None:
            tree.free_reserved(extent)


class PutSession:
    """One streamed put: blocks arrive in ascending order and are linked as they come.

    The session pins its cursor (the deepest block stored or found so far), so the path it
    extends cannot be evicted between chunks; it stops storing (counting the rest as skipped) when
    the store has no room, the path was dropped, or a block's parent is missing.
    """

    def __init__(self, store: KVStore, namespace: bytes, layout: KVLayout, token_bytes: bytes, owner: str) -> None:
        self._store = store
        self._tree = store.tree
        self.layout = layout
        self.num_blocks = len(token_bytes) // layout.block_key_bytes
        self._token_bytes = token_bytes
        self._owner = owner
        self._cursor = self._tree.get_or_create_namespace(namespace, layout).root
        self._tree.pin([self._cursor])
        self._path: list[Node] = []
        self._local_nodes: list[Node] = []
        self._stopped = False
        self._evicted_before = self._tree.evicted_blocks
        self.counts = PutCounts()

    @property
    def next_block_index(self) -> int:
        return self._cursor.block_index + 1

    def add_block(self, index: int, global_kv: bytes | memoryview, local_kv: bytes | memoryview | None) -> None:
        """Store block `index` (> every earlier index; sizes already validated)."""
        tree = self._tree
        if self._stopped or self._cursor.detached:
            self._stopped = True
            self.counts.skipped_blocks += 1
            return
        if index > self.next_block_index:  # the engine skipped blocks it knows are stored
            between = tree.existing_path(self._cursor, self._token_bytes, index)
            if len(between) != index - self.next_block_index:
                self._stopped = True
                self.counts.skipped_blocks += 1
                return
            self._path.extend(between)
            self._advance(between[-1])
        kb = self.layout.block_key_bytes
        key = self._token_bytes[index * kb : (index + 1) * kb]
        node = self._cursor.children.get(key)
        if node is None:
            g = tree.allocate(len(global_kv))
            if g is None:
                self._stopped = True
                self.counts.skipped_blocks += 1
                return
            self._store.arena.write(g, global_kv)
            node = tree.insert(self._cursor, key, g, None, self._owner)
            self.counts.stored_blocks += 1
            self.counts.stored_bytes += len(global_kv)
            self._store.counters.put_bytes += len(global_kv)
        else:
            tree.add_owner(node, self._owner)
            self.counts.existing_blocks += 1
        self._advance(node)
        self._path.append(node)
        if local_kv is not None:
            self._local_nodes.append(node)
            if node.local_extent is None:
                extent = tree.allocate(len(local_kv))
                if extent is not None:
                    self._store.arena.write(extent, local_kv)
                    tree.attach_local(node, extent)
                    self.counts.stored_bytes += len(local_kv)
                    self._store.counters.put_bytes += len(local_kv)

    def close(self) -> PutCounts:
        """Touch what was stored and unpin; the session is over."""
        self._tree.touch(self._path, self._local_nodes)
        self._tree.unpin([self._cursor])
        self.counts.evicted_blocks = self._tree.evicted_blocks - self._evicted_before
        return self.counts

    def _advance(self, node: Node) -> None:
        self._tree.pin([node])
        self._tree.unpin([self._cursor])
        self._cursor = node
