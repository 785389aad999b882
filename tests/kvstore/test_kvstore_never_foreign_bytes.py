"""The kvstore never returns bytes it did not write.

Store level (fake clock): a prepared slot that was never written is refused at commit; an expired put
lease's space is not reused within one TTL; seeded random interleavings of prepare / write (whole,
partial, none, late) / commit / expire / evict / drop only ever fetch each namespace's own bytes.
Process level: the same refusal over gRPC, and the per-peer lease cap.
"""

from __future__ import annotations

import random
import zlib

import grpc
import numpy as np
import pytest
from kvstore_testlib import LAYOUT, NS_A, NS_B, KVStoreProcess, fetch_bytes, make_store, payload, put

from salon.api.kvstore.v1 import kvstore_pb2 as pb
from salon.api.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from salon.common.kvstore_contract.client import layout_to_proto
from salon.common.prefix_hash import encode_token_ids
from salon.kvstore.allocator import aligned
from salon.kvstore.store import LeaseLimit, unwritten_slot

NS_C, NS_D = b"C" * 32, b"D" * 32
NAMESPACES = [NS_A, NS_B, NS_C, NS_D]


def intended(ns: bytes, ctx: list[int], slot) -> tuple[bytes | None, bytes | None]:
    """What the engine means to write into a slot: the payloads of its own prefix."""
    g = payload(ns, ctx, slot.block_index, "g", LAYOUT.global_bytes_per_block, 4) if slot.global_extent else None
    loc = payload(ns, ctx, slot.block_index, "l", LAYOUT.local_bytes_per_block, 4) if slot.local_extent else None
    return g, loc


def checksums(ns: bytes, ctx: list[int], slots) -> tuple[list[int], list[int]]:
    g = [zlib.crc32(intended(ns, ctx, s)[0]) for s in slots if s.global_extent]
    loc = [zlib.crc32(intended(ns, ctx, s)[1]) for s in slots if s.local_extent]
    return g, loc


def commit_checked(store, ns, ctx, lease, slots):
    """What the servicer does: refuse (and release) unless every slot holds the engine's bytes."""
    problem = unwritten_slot(store.arena, slots, *checksums(ns, ctx, slots))
    if problem is not None:
        store.release_lease(lease)
        return None
    return store.commit_shared_put(lease)


def test_a_prepared_slot_never_written_is_refused_and_fetches_nothing(tmp_path) -> None:
    store = make_store(tmp_path, 1 << 16)
    ctx = list(range(16))
    # Fill, then drop, another namespace: its freed bytes are what an unzeroed slot would hold.
    put(store, NS_B, ctx, local_blocks={3})
    node_extents = [e for n in store.tree.attached_nodes() for e in (n.global_extent, n.local_extent) if e]
    store.drop(NS_B, "")
    for extent in node_extents:  # a dropped block's bytes are zeroed at once (erasure)
        assert not any(store.arena.read(extent))
    for start, length in store.tree.allocator.free_runs():  # a writer that broke its lease's contract
        store.arena.array[start : start + length] = 0xAB
    lease, slots, existing = store.prepare_shared_put(NS_A, LAYOUT, encode_token_ids(ctx), "c", 4, frozenset({3}))
    assert existing == 0 and len(slots) == 4
    for slot in slots:  # reserved space is zero, never another namespace's leftovers
        for extent in (slot.global_extent, slot.local_extent):
            if extent is not None:
                assert not any(store.arena.read(extent))
    assert commit_checked(store, NS_A, ctx, lease, slots) is None
    assert fetch_bytes(store, NS_A, ctx) == (0, [])
    # Half written (the last slot untouched): refused as a whole.
    lease, slots, _ = store.prepare_shared_put(NS_A, LAYOUT, encode_token_ids(ctx), "c", 4, frozenset({3}))
    for slot in slots[:-1]:
        g, loc = intended(NS_A, ctx, slot)
        store.arena.write(slot.global_extent, g)
        if loc is not None:
            store.arena.write(slot.local_extent, loc)
    assert "block 3" in unwritten_slot(store.arena, slots, *checksums(NS_A, ctx, slots))
    assert commit_checked(store, NS_A, ctx, lease, slots) is None
    assert fetch_bytes(store, NS_A, ctx) == (0, [])
    store.tree.check_invariants()
    assert store.tree.used_bytes == 0


def _overlaps(a, b) -> bool:
    return a.offset < b.offset + aligned(b.length) and b.offset < a.offset + aligned(a.length)


def test_an_expired_put_lease_is_not_reused_within_its_ttl(tmp_path) -> None:
    now = [0.0]
    store = make_store(tmp_path, 64 * 40, lease_ttl_s=10.0, clock=lambda: now[0])  # room for 40 global blocks
    ctx = [7] * 64
    lease, slots, _ = store.prepare_shared_put(NS_A, LAYOUT, encode_token_ids(ctx), "c", 16, frozenset())
    held = [s.global_extent for s in slots]
    now[0] = 10.0
    assert store.expire_leases() == 1
    # Everything else is allocated and evicted over and over: never into the expired lease's space.
    for i in range(60):
        now[0] = 10.0 + i * 0.16  # up to 19.44 s: within the TTL after expiry
        store.release_quarantine()
        put(store, NS_B, [i % 3, i] * 40)
        for node in store.tree.attached_nodes():
            assert not any(_overlaps(node.global_extent, e) for e in held)
    # A writer that was late (within one TTL of the expiry) touched only quarantined space.
    for extent in held:
        store.arena.write(extent, b"\xee" * extent.length)
    for node in store.tree.attached_nodes():
        assert bytes(store.arena.read(node.global_extent)) != b"\xee" * 64
    now[0] = 20.0
    assert store.release_quarantine() == len(held) and store.quarantined_bytes == 0
    for extent in held:  # freed bytes are zeroed
        assert not any(store.arena.read(extent))
    store.tree.check_invariants()


@pytest.mark.parametrize("seed", range(6))
def test_random_interleavings_fetch_only_each_namespaces_own_bytes(tmp_path, seed) -> None:
    rng = random.Random(seed)
    now = [0.0]
    ttl = 5.0
    store = make_store(tmp_path, 64 * 48 + 128 * 12, lease_ttl_s=ttl, clock=lambda: now[0], max_leases_per_peer=6)
    live = []  # prepared puts: (ns, ctx, lease, slots, peer)
    late = []  # expired puts whose writer is still running: (ns, ctx, slots, must write before)
    contexts = {ns: [] for ns in NAMESPACES}
    refused = committed = late_writes = 0

    def context(ns):
        if contexts[ns] and rng.random() < 0.6:
            base = rng.choice(contexts[ns])
            return base[: rng.randrange(len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 12))]
        return [rng.randrange(3) for _ in range(rng.randrange(4, 40))]

    def write(ns, ctx, slots, share):
        for slot in slots[: int(len(slots) * share)]:
            g, loc = intended(ns, ctx, slot)
            if g is not None:
                store.arena.write(slot.global_extent, g)
            if loc is not None:
                store.arena.write(slot.local_extent, loc)

    for _ in range(1500):
        op = rng.random()
        ns = rng.choice(NAMESPACES)
        if op < 0.25:  # prepare a shared-memory put
            ctx = context(ns)
            n = len(ctx) // 4
            peer = rng.choice(["e0", "e1"])
            try:
                lease, slots, _ = store.prepare_shared_put(
                    ns,
                    LAYOUT,
                    encode_token_ids(ctx),
                    rng.choice(["", "c1", "c2"]),
                    n,
                    frozenset(range(max(0, n - 2), n)),
                    peer=peer,
                )
            except LeaseLimit:
                continue
            live.append((ns, ctx, lease, slots, peer))
            contexts[ns].append(ctx)
        elif op < 0.45 and live:  # write (all, part, none) and commit
            ns, ctx, lease, slots, _ = live.pop(rng.randrange(len(live)))
            write(ns, ctx, slots, rng.choice([1.0, 1.0, 1.0, 0.5, 0.0]))
            counts = commit_checked(store, ns, ctx, lease, slots)
            refused += counts is None and store.put_slots(lease) is None and bool(slots)
            committed += counts is not None
        elif op < 0.55:  # a whole put over gRPC (evicts when full)
            ctx = context(ns)
            put(
                store,
                ns,
                ctx,
                local_blocks=set(range(max(0, len(ctx) // 4 - 2), len(ctx) // 4)),
                owner=rng.choice(["", "c1", "c2"]),
            )
            contexts[ns].append(ctx)
        elif op < 0.65:  # time passes: leases expire, their writers may still be writing
            now[0] += rng.uniform(0.5, 4.0)
            expired_before = {id(x) for x in live}
            store.expire_leases()
            for entry in list(live):
                if store.put_slots(entry[2]) is None and id(entry) in expired_before:
                    live.remove(entry)
                    late.append((entry[0], entry[1], entry[3], now[0] + ttl * 0.9))
            store.release_quarantine()
        elif op < 0.75 and late:  # a late writer finishes within one TTL of the expiry
            ns, ctx, slots, before = late.pop(rng.randrange(len(late)))
            if now[0] < before:
                write(ns, ctx, slots, 1.0)
                late_writes += 1
        elif op < 0.8:  # erase a conversation or a namespace
            store.drop(ns, rng.choice(["", "c1", "c2"]))
        else:  # fetch: every byte must be this namespace's own payload for this prefix
            if not contexts[ns]:
                continue
            ctx = context(ns)
            num_tokens, blocks = fetch_bytes(store, ns, ctx)
            for i, (g, loc) in enumerate(blocks):
                assert g == payload(ns, ctx, i, "g", LAYOUT.global_bytes_per_block, 4), (seed, i)
                if loc is not None:
                    assert loc == payload(ns, ctx, i, "l", LAYOUT.local_bytes_per_block, 4), (seed, i)
        store.tree.check_invariants()
        assert store.num_leases_of("e0") <= 6 and store.num_leases_of("e1") <= 6
    assert committed > 20 and refused > 5 and late_writes > 3, (committed, refused, late_writes)


def test_leases_are_capped_per_peer(tmp_path) -> None:
    store = make_store(tmp_path, 1 << 16, max_leases_per_peer=2)
    token_bytes = encode_token_ids(list(range(8)))
    a = store.prepare_shared_put(NS_A, LAYOUT, token_bytes, "", 2, frozenset(), peer="e0")[0]
    store.prepare_shared_put(NS_A, LAYOUT, token_bytes, "", 2, frozenset(), peer="e0")
    used = store.tree.used_bytes
    with pytest.raises(LeaseLimit):
        store.prepare_shared_put(NS_A, LAYOUT, token_bytes, "", 2, frozenset(), peer="e0")
    assert store.tree.used_bytes == used  # nothing reserved for the refused one
    store.prepare_shared_put(NS_A, LAYOUT, token_bytes, "", 2, frozenset(), peer="e1")
    assert store.release_lease(a)
    store.prepare_shared_put(NS_A, LAYOUT, token_bytes, "", 2, frozenset(), peer="e0")
    assert store.num_leases_of("e0") == 2 and store.num_leases_of("e1") == 1


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    proc = KVStoreProcess(
        tmp_path_factory.mktemp("foreign"),
        capacity_bytes=1 << 20,
        extra=("--internal-auth", "insecure-loopback", "--max-leases-per-peer", "3"),
    )
    yield proc
    assert proc.stop() == 0


def _prepare(stub, ns, ctx, num_blocks):
    header = pb.PutHeader(namespace=ns, token_ids_le32=encode_token_ids(ctx), layout=layout_to_proto(LAYOUT))
    return stub.PrepareSharedPut(pb.PrepareSharedPutRequest(header=header, num_blocks=num_blocks))


def test_over_grpc_a_commit_without_the_writes_is_refused(small_store) -> None:
    ctx = list(range(100, 116))
    with grpc.insecure_channel(small_store.target) as channel:
        stub = pb_grpc.KVStoreServiceStub(channel)
        prepared = _prepare(stub, NS_C, ctx, 4)
        assert len(prepared.slots) == 4
        crc = [zlib.crc32(payload(NS_C, ctx, s.block_index, "g", 64, 4)) for s in prepared.slots]
        with pytest.raises(grpc.RpcError) as info:
            stub.CommitSharedPut(pb.CommitSharedPutRequest(lease_id=prepared.lease_id, global_crc32=crc))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "block 0" in info.value.details() and "nothing was stored" in info.value.details()
        fetch = pb.FetchRequest(namespace=NS_C, token_ids_le32=encode_token_ids(ctx), layout=layout_to_proto(LAYOUT))
        assert [m.header.num_tokens for m in stub.Fetch(fetch) if m.HasField("header")] == [0]
        # Written for real: stored, and served back byte for byte.
        prepared = _prepare(stub, NS_C, ctx, 4)
        arena = np.memmap(prepared.shm_name, np.uint8, "r+")
        for s in prepared.slots:
            arena[s.global_offset : s.global_offset + 64] = np.frombuffer(
                payload(NS_C, ctx, s.block_index, "g", 64, 4), np.uint8
            )
        arena.flush()
        counts = stub.CommitSharedPut(pb.CommitSharedPutRequest(lease_id=prepared.lease_id, global_crc32=crc)).counts
        assert counts.stored_blocks == 4
        assert stub.GetStats(pb.GetStatsRequest()).shm_name == prepared.shm_name


def test_over_grpc_only_the_local_kv_unwritten_is_refused(small_store) -> None:
    """Every global slot written, the one local (sliding-window layers) slot not: the local checksum refuses it."""
    ctx = list(range(300, 316))
    with grpc.insecure_channel(small_store.target) as channel:
        stub = pb_grpc.KVStoreServiceStub(channel)
        header = pb.PutHeader(namespace=NS_C, token_ids_le32=encode_token_ids(ctx), layout=layout_to_proto(LAYOUT))
        request = pb.PrepareSharedPutRequest(header=header, num_blocks=4, local_block_indices=[3])

        def prepare_and_write_global():
            prepared = stub.PrepareSharedPut(request)
            assert [(s.block_index, s.write_global, s.write_local) for s in prepared.slots] == [
                (0, True, False),
                (1, True, False),
                (2, True, False),
                (3, True, True),
            ]
            arena = np.memmap(prepared.shm_name, np.uint8, "r+")
            for s in prepared.slots:
                g = payload(NS_C, ctx, s.block_index, "g", LAYOUT.global_bytes_per_block, 4)
                arena[s.global_offset : s.global_offset + len(g)] = np.frombuffer(g, np.uint8)
            arena.flush()
            return prepared, arena

        g_crc = [zlib.crc32(payload(NS_C, ctx, i, "g", LAYOUT.global_bytes_per_block, 4)) for i in range(4)]
        local = payload(NS_C, ctx, 3, "l", LAYOUT.local_bytes_per_block, 4)
        commit = lambda lease_id: stub.CommitSharedPut(
            pb.CommitSharedPutRequest(lease_id=lease_id, global_crc32=g_crc, local_crc32=[zlib.crc32(local)])
        )
        prepared, _arena = prepare_and_write_global()
        with pytest.raises(grpc.RpcError) as info:
            commit(prepared.lease_id)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert info.value.details().startswith("block 3: the local KV at offset ")
        assert info.value.details().endswith("is not what was written; nothing was stored")
        fetch = pb.FetchRequest(namespace=NS_C, token_ids_le32=encode_token_ids(ctx), layout=layout_to_proto(LAYOUT))
        assert [m.header.num_tokens for m in stub.Fetch(fetch) if m.HasField("header")] == [0]
        # Control: the same put with the local KV written is stored, local KV included.
        prepared, arena = prepare_and_write_global()
        (slot,) = [s for s in prepared.slots if s.write_local]
        arena[slot.local_offset : slot.local_offset + len(local)] = np.frombuffer(local, np.uint8)
        arena.flush()
        assert commit(prepared.lease_id).counts.stored_blocks == 4
        assert [m.header.num_tokens for m in stub.Fetch(fetch) if m.HasField("header")] == [16]


def test_over_grpc_a_peer_holds_at_most_its_lease_cap(small_store) -> None:
    ctx = list(range(200, 208))
    own_connection = [("grpc.use_local_subchannel_pool", 1)]
    with (
        grpc.insecure_channel(small_store.target, options=own_connection) as channel,
        grpc.insecure_channel(small_store.target, options=own_connection) as other,
    ):
        stub = pb_grpc.KVStoreServiceStub(channel)
        leases = [_prepare(stub, NS_D, ctx, 2).lease_id for _ in range(3)]
        with pytest.raises(grpc.RpcError) as info:
            _prepare(stub, NS_D, ctx, 2)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "3" in info.value.details()
        _prepare(pb_grpc.KVStoreServiceStub(other), NS_D, ctx, 2)  # another connection is another peer
        for lease in leases:
            assert stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease)).released
        _prepare(stub, NS_D, ctx, 2)
