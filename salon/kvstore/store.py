"""The kvstore's domain API: the radix tree, the arena that holds its bytes, and leases.

Everything here runs on the service's single asyncio thread and never awaits, so each call is one
short critical section: a reader never sees a half-written block (a block's bytes are copied into
its extent before the node is linked), and nothing can be evicted while pinned.

Shared-memory transfer:
  fetch   begin_fetch pins the usable path; a lease keeps it pinned until release_lease or the
          lease's TTL, and the engine reads the blocks' extents directly (and discards what it read
          if its lease ended meanwhile).
  put     prepare_shared_put reserves extents for the blocks the store lacks (filled with the
          lease's canary, and the existing path pinned); the engine writes them and calls
          commit_shared_put, which links the blocks that are still missing and frees the rest. The
          servicer first checks every slot's bytes against the engine's checksums (put_slots), and
          that no slot still holds the canary, so a slot that was never written is never linked
          whatever checksum is sent.

The store never returns bytes it did not write:
  * free arena bytes are zero (the tree zeroes every extent it frees) and prepared slots hold only
    their lease's canary, so unwritten space never holds another namespace's KV;
  * an expired put lease is revoked, not ended: its extents stay quarantined (reserved, never
    handed to another block) until its writer is provably done with them, because the engine
    writes into the arena directly and a writer that stalled past its lease may still write. The
    proofs: the writer commits or releases the lease (it does so only after its write; the late
    commit itself is refused), it reports that all its writes below the lease's generation are
    over (writer_progress), or its process holds its writer lock no more (release_quarantine,
    salon/common/kvstore_contract/writer_lock.py). A lease without a writer lock waits for the
    first of those. Revoked leases still count against their peer's lease cap;
  * each peer holds at most max_leases_per_peer leases (LeaseLimit), so no caller can pin or
    reserve the whole arena.
"""

from __future__ import annotations

import secrets
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from salon.common.kvstore_contract.layout import KVLayout, MatchResult
from salon.kvstore.allocator import Extent
from salon.kvstore.arena import Arena
from salon.kvstore.radix_tree import Node, RadixTree

LeaseId = str


class LeaseLimit(Exception):
    """The peer already holds max_leases_per_peer leases."""


class UnknownWriter(Exception):
    """A shared-memory put names a writer lock that no process holds on the arena."""


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
    """Where the engine writes one block of a shared-memory put (None: the store has it).

    canary: the lease's 8-byte pattern the slot's extents hold until written (empty: not filled)."""

    block_index: int
    global_extent: Extent | None
    local_extent: Extent | None
    canary: bytes = b""


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
    generation: int = 0  # put leases: ascending in grant order
    writer: int = 0  # put leases: the writer lock its engine holds (0: none)


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
        writer_alive: Callable[[int], bool] | None = None,
    ):
        self.tree = tree
        self.arena = arena
        self.lease_ttl_s = lease_ttl_s
        self.max_leases_per_peer = max_leases_per_peer
        self.counters = StoreCounters()
        self._clock = clock
        self._writer_alive = writer_alive or arena.writer_alive
        self._leases: dict[LeaseId, _Lease] = {}
        # Live and revoked leases per peer (what the cap counts).
        self._leases_by_peer: dict[str, int] = {}
        # Expired put leases whose writer may still write: their extents stay reserved.
        self._revoked: dict[LeaseId, _Lease] = {}
        self.quarantined_bytes = 0
        self._generation = 0

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
            raise LeaseLimit(
                f"{peer} already holds {self.max_leases_per_peer} shared-memory leases (an expired put lease "
                f"counts until its writer is done with it)"
            )

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
        writer: int = 0,
    ) -> tuple[LeaseId, list[PutSlot], int]:
        """Reserve extents for the blocks of [0, num_blocks) the store lacks (global KV, and local KV
        for blocks in local_blocks), each filled with the lease's canary. The engine has global KV only
        for blocks >= first_block: a missing block below it means nothing more is reserved. Returns
        (lease, slots to write, blocks already stored). Stops at the first block it cannot make room
        for. LeaseLimit (nothing reserved) when `peer` holds too many leases; UnknownWriter when
        `writer` is not 0 and no process holds that writer lock."""
        self.check_lease_room(peer)
        if writer and not self._writer_alive(writer):
            raise UnknownWriter(f"writer_id: no process holds writer lock {writer} on this kvstore's arena")
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
        canary = _new_canary()
        pattern = canary_pattern(canary, max(layout.global_bytes_per_block, layout.local_bytes_per_block))
        slots = [PutSlot(s.block_index, s.global_extent, s.local_extent, canary) for s in slots]
        for slot in slots:
            for extent in (slot.global_extent, slot.local_extent):
                if extent is not None:
                    self.arena.fill(extent, pattern)
        counts = PutCounts(existing_blocks=len(existing))
        prepared = _PreparedPut(namespace, layout, token_bytes, owner, existing, slots, counts)
        self._generation += 1
        lease = _Lease(self._clock() + self.lease_ttl_s, peer, put=prepared, generation=self._generation, writer=writer)
        return self._new_lease(lease), slots, len(existing)

    def lease_generation(self, lease_id: LeaseId) -> int:
        """A put lease's generation (live or revoked); 0 if unknown."""
        lease = self._leases.get(lease_id) or self._revoked.get(lease_id)
        return 0 if lease is None else lease.generation

    def revoked(self, lease_id: LeaseId) -> bool:
        """True if `lease_id` is a put lease that expired and whose writer has not ended it yet."""
        return lease_id in self._revoked

    def put_slots(self, lease_id: LeaseId) -> list[PutSlot] | None:
        """The slots of a prepared put (a query: to check what the engine wrote); None if unknown."""
        lease = self._leases.get(lease_id)
        return None if lease is None or lease.put is None else lease.put.slots

    def commit_shared_put(self, lease_id: LeaseId) -> PutCounts | None:
        """Link the written blocks (the caller has checked them against the engine's checksums);
        None if the lease is unknown or expired (nothing stored). A commit of an expired lease tells
        that its writer is done with it: its quarantined space is freed."""
        if self._free_revoked(lease_id):
            return None
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
        """End a lease at its holder's word (it is done reading or writing): space is free at once.
        False if it was not held (unknown, or expired: an expired put's quarantine ends here too)."""
        if self._free_revoked(lease_id):
            return False
        lease = self._pop_lease(lease_id)
        if lease is None:
            return False
        self._end(lease)
        return True

    def expire_leases(self) -> int:
        """End the leases past their TTL; an expired put is revoked: its space stays quarantined."""
        now = self._clock()
        expired = [lid for lid, lease in self._leases.items() if lease.expires_at_s <= now]
        for lid in expired:
            lease = self._leases.pop(lid)
            if lease.put is None:
                self._unpeer(lease.peer)
                self._end(lease)
                continue
            self._revoked[lid] = lease
            self.quarantined_bytes += _slot_bytes(lease.put.slots)
            self.tree.unpin(lease.put.existing)
        self.counters.expired_leases += len(expired)
        return len(expired)

    def writer_progress(self, writer: int, done_below_generation: int) -> int:
        """`writer` says none of its writes under leases of a generation below done_below_generation
        is running or will start: free those of its revoked leases. Returns how many."""
        if not writer:
            return 0
        done = [
            lid
            for lid, lease in self._revoked.items()
            if lease.writer == writer and lease.generation < done_below_generation
        ]
        for lid in done:
            self._free_revoked(lid)
        return len(done)

    def release_quarantine(self) -> int:
        """Free the revoked leases whose writer's process is gone (its writer lock is not held any
        more); returns how many."""
        alive: dict[int, bool] = {}
        gone = []
        for lid, lease in self._revoked.items():
            if lease.writer:
                if lease.writer not in alive:
                    alive[lease.writer] = self._writer_alive(lease.writer)
                if not alive[lease.writer]:
                    gone.append(lid)
        for lid in gone:
            self._free_revoked(lid)
        return len(gone)

    @property
    def num_leases(self) -> int:
        return len(self._leases)

    def num_leases_of(self, peer: str) -> int:
        return self._leases_by_peer.get(peer, 0)

    def close(self) -> None:
        for lid in list(self._leases):
            self._end(self._pop_lease(lid))
        for lid in list(self._revoked):
            self._free_revoked(lid)

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
            self._unpeer(lease.peer)
        return lease

    def _unpeer(self, peer: str) -> None:
        left = self._leases_by_peer[peer] - 1
        if left:
            self._leases_by_peer[peer] = left
        else:
            del self._leases_by_peer[peer]

    def _end(self, lease: _Lease) -> None:
        if lease.fetch is not None:
            self.end_fetch(lease.fetch)
        if lease.put is not None:
            for slot in lease.put.slots:
                _free_slot(self.tree, slot)
            self.tree.unpin(lease.put.existing)

    def _free_revoked(self, lease_id: LeaseId) -> bool:
        """End a revoked lease's quarantine (its writer is done): its extents are zeroed and freed."""
        lease = self._revoked.pop(lease_id, None)
        if lease is None:
            return False
        self._unpeer(lease.peer)
        self.quarantined_bytes -= _slot_bytes(lease.put.slots)
        for slot in lease.put.slots:
            _free_slot(self.tree, slot)
        return True

    def _attach_or_free(self, node: Node, extent: Extent, local_nodes: list[Node]) -> int:
        """Give `node` the local KV written at `extent` unless it has some; returns bytes stored."""
        local_nodes.append(node)
        if node.local_extent is None and not node.detached:
            self.tree.attach_local(node, extent)
            return extent.length
        self.tree.free_reserved(extent)
        return 0


def canary_pattern(canary: bytes, num_bytes: int) -> np.ndarray:
    """uint8 [num_bytes]: the canary repeated."""
    return np.frombuffer((canary * (num_bytes // max(len(canary), 1) + 1))[:num_bytes], np.uint8)


def _new_canary() -> bytes:
    """8 random bytes, never all zero (free space is zero: a canary must differ from it)."""
    while True:
        canary = secrets.token_bytes(8)
        if any(canary):
            return canary


def unwritten_slot(arena: Arena, slots: list[PutSlot], global_crc32: list[int], local_crc32: list[int]) -> str | None:
    """What is wrong with a prepared put's slots given the engine's checksums (None: all written).

    A slot must hold bytes whose CRC-32 is the engine's, and must not still hold its lease's canary:
    a slot never written is refused whatever checksum is sent (the canary's included). Cost: one CRC
    per slot, plus a byte comparison only when a slot's CRC equals the canary's.

    Reads only the slots' extents, which the lease owns, so it may run in a worker thread."""
    g_slots = [s for s in slots if s.global_extent is not None]
    l_slots = [s for s in slots if s.local_extent is not None]
    if len(global_crc32) != len(g_slots) or len(local_crc32) != len(l_slots):
        return (
            f"global_crc32 / local_crc32: {len(global_crc32)} / {len(local_crc32)} checksums for "
            f"{len(g_slots)} / {len(l_slots)} written slots"
        )
    canary_crc: dict[tuple[bytes, int], int] = {}
    for kind, chosen, sums in (("global", g_slots, global_crc32), ("local", l_slots, local_crc32)):
        for slot, expected in zip(chosen, sums):
            extent = slot.global_extent if kind == "global" else slot.local_extent
            held = arena.read(extent)
            crc = zlib.crc32(held)
            if crc != expected:
                return f"block {slot.block_index}: the {kind} KV at offset {extent.offset} is not what was written"
            if slot.canary:
                key = (slot.canary, extent.length)
                if key not in canary_crc:
                    canary_crc[key] = zlib.crc32(canary_pattern(slot.canary, extent.length))
                if crc == canary_crc[key] and held == canary_pattern(slot.canary, extent.length).tobytes():
                    return (
                        f"block {slot.block_index}: the {kind} KV at offset {extent.offset} was never written "
                        f"(it still holds the lease's canary)"
                    )
    return None


def _slot_bytes(slots: list[PutSlot]) -> int:
    return sum(e.length for slot in slots for e in (slot.global_extent, slot.local_extent) if e is not None)


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
