"""The kvstore never returns bytes it did not write.

Store level (fake clock): a prepared slot that was never written is refused at commit, whatever checksum
comes with it (the zeros' or the canary's included); an expired put lease's space is not reused until its
writer is provably done with it (a late commit or release, its progress report, or its writer lock gone),
however late that is; seeded random interleavings of prepare / write (whole, partial, none, late) /
commit / expire / writer death / evict / drop only ever fetch each namespace's own bytes.
Process level: the same refusals over gRPC, and the per-peer lease cap.
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
from salon.common.kvstore_contract.arena_mapping import ArenaMapping
from salon.common.kvstore_contract.client import layout_to_proto
from salon.common.prefix_hash import encode_token_ids
from salon.kvstore.allocator import aligned
from salon.kvstore.store import LeaseLimit, UnknownWriter, canary_pattern, unwritten_slot

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
    canary = slots[0].canary
    assert len(canary) == 8 and any(canary) and all(s.canary == canary for s in slots)
    for slot in slots:  # reserved space holds the lease's canary, never another namespace's leftovers
        for extent in (slot.global_extent, slot.local_extent):
            if extent is not None:
                assert bytes(store.arena.read(extent)) == (canary * 16)[: extent.length]
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


def test_an_unwritten_slot_is_refused_whatever_checksum_is_sent(tmp_path) -> None:
    store = make_store(tmp_path, 1 << 16)
    ctx = list(range(40, 56))
    token_bytes = encode_token_ids(ctx)
    lease, slots, _ = store.prepare_shared_put(NS_A, LAYOUT, token_bytes, "", 4, frozenset({3}))
    g_sums, l_sums = checksums(NS_A, ctx, slots)
    zeros = zlib.crc32(bytes(64)), zlib.crc32(bytes(128))
    canary = zlib.crc32(canary_pattern(slots[0].canary, 64)), zlib.crc32(canary_pattern(slots[0].canary, 128))
    # All but block 2 written: block 2's global KV is claimed with the CRC of zeros, then of the canary.
    for slot in slots:
        g, loc = intended(NS_A, ctx, slot)
        if slot.block_index != 2:
            store.arena.write(slot.global_extent, g)
        if loc is not None:
            store.arena.write(slot.local_extent, loc)
    offset = slots[2].global_extent.offset
    for crc, problem in (
        (zeros[0], f"block 2: the global KV at offset {offset} is not what was written"),
        (canary[0], f"block 2: the global KV at offset {offset} was never written (it still holds the lease's canary)"),
    ):
        claimed = [crc if s.block_index == 2 else g_sums[i] for i, s in enumerate(slots)]
        assert unwritten_slot(store.arena, slots, claimed, l_sums) == problem
    # A local slot left unwritten, claimed with the canary's CRC: refused too.
    store.arena.write(slots[2].global_extent, intended(NS_A, ctx, slots[2])[0])
    assert unwritten_slot(store.arena, slots, g_sums, l_sums) is None  # positive control: all written
    store.arena.fill(slots[3].local_extent, canary_pattern(slots[3].canary, 128))
    assert "block 3: the local KV" in unwritten_slot(store.arena, slots, g_sums, [canary[1]])
    assert "never written" in unwritten_slot(store.arena, slots, g_sums, [canary[1]])
    # A writer whose KV is all zeros did write: accepted.
    lease2, slots2, _ = store.prepare_shared_put(NS_B, LAYOUT, token_bytes, "", 1, frozenset())
    store.arena.write(slots2[0].global_extent, bytes(64))
    assert unwritten_slot(store.arena, slots2, [zeros[0]], []) is None
    assert store.commit_shared_put(lease2).stored_blocks == 1
    assert store.release_lease(lease)


def _overlaps(a, b) -> bool:
    return a.offset < b.offset + aligned(b.length) and b.offset < a.offset + aligned(a.length)


def test_an_expired_put_lease_is_not_reused_until_its_writer_is_done(tmp_path) -> None:
    now = [0.0]
    store = make_store(tmp_path, 64 * 40, lease_ttl_s=10.0, clock=lambda: now[0])  # room for 40 global blocks
    writer = ArenaMapping(store.arena.name, str(tmp_path))  # a live writer: it holds its writer lock
    ctx = [7] * 64
    token_bytes = encode_token_ids(ctx)
    lease, slots, _ = store.prepare_shared_put(NS_A, LAYOUT, token_bytes, "c", 16, frozenset(), writer=writer.writer_id)
    held = [s.global_extent for s in slots]
    now[0] = 10.0
    assert store.expire_leases() == 1 and store.revoked(lease) and store.quarantined_bytes == 16 * 64
    # Everything else is allocated and evicted over and over, long past any TTL: never into the expired
    # lease's space, while its writer lives and has not said it is done.
    for i in range(60):
        now[0] = 10.0 + i * 5.0  # up to 30 TTLs after the expiry
        assert store.release_quarantine() == 0
        put(store, NS_B, [i % 3, i] * 40)
        for node in store.tree.attached_nodes():
            assert not any(_overlaps(node.global_extent, e) for e in held)
    # A writer stalled that long writes now: it touches only quarantined space.
    for extent in held:
        store.arena.write(extent, b"\xee" * extent.length)
    for node in store.tree.attached_nodes():
        assert bytes(store.arena.read(node.global_extent)) != b"\xee" * 64
    # Progress below the lease's generation says nothing about it; its late commit ends it (refused).
    assert store.writer_progress(writer.writer_id, store.lease_generation(lease)) == 0
    assert store.revoked(lease) and store.commit_shared_put(lease) is None
    assert not store.revoked(lease) and store.quarantined_bytes == 0
    for extent in held:  # freed bytes are zeroed
        assert not any(store.arena.read(extent))
    assert store.num_leases == 0 and store.num_leases_of("") == 0
    store.tree.check_invariants()
    writer.close()


def test_a_revoked_lease_ends_with_its_writers_release_progress_or_death(tmp_path) -> None:
    now = [0.0]
    store = make_store(tmp_path, 64 * 64, lease_ttl_s=1.0, clock=lambda: now[0], max_leases_per_peer=3)
    writers = [ArenaMapping(store.arena.name, str(tmp_path)) for _ in range(2)]
    token_bytes = encode_token_ids(list(range(16)))

    def prepare(writer_id: int) -> str:
        return store.prepare_shared_put(NS_A, LAYOUT, token_bytes, "", 4, frozenset(), peer="e", writer=writer_id)[0]

    leases = [prepare(writers[0].writer_id), prepare(writers[1].writer_id), prepare(0)]
    generations = [store.lease_generation(x) for x in leases]
    assert generations == sorted(generations) and len(set(generations)) == 3
    now[0] = 1.0
    assert store.expire_leases() == 3 and store.quarantined_bytes == 3 * 4 * 64
    with pytest.raises(LeaseLimit):  # revoked leases still count against their peer's cap
        prepare(writers[0].writer_id)
    # Writer 0 reports that its writes below a generation past its lease are over: freed.
    assert store.writer_progress(writers[1].writer_id, generations[0] + 1) == 0  # another writer's word
    assert store.writer_progress(writers[0].writer_id, generations[0]) == 0  # not past it
    assert store.writer_progress(writers[0].writer_id, generations[0] + 1) == 1
    assert store.quarantined_bytes == 2 * 4 * 64
    # Writer 1's process ends (its lock goes with its open file): freed at the next sweep. The lease
    # without a writer lock waits for its writer's word, however long.
    assert store.release_quarantine() == 0
    writers[1].close()
    now[0] = 1000.0
    assert store.release_quarantine() == 1 and store.quarantined_bytes == 4 * 64
    assert store.revoked(leases[2])
    assert not store.release_lease(leases[2])  # it had expired: not held, but its quarantine ends
    assert store.quarantined_bytes == 0 and store.num_leases_of("e") == 0
    assert store.tree.used_bytes == 0
    # A writer lock nobody holds is refused before anything is reserved.
    with pytest.raises(UnknownWriter, match="writer lock"):
        prepare(writers[1].writer_id)
    assert store.tree.used_bytes == 0 and store.num_leases == 0
    writers[0].close()


@pytest.mark.parametrize("seed", range(6))
def test_random_interleavings_fetch_only_each_namespaces_own_bytes(tmp_path, seed) -> None:
    rng = random.Random(seed)
    now = [0.0]
    ttl = 5.0
    store = make_store(tmp_path, 64 * 48 + 128 * 12, lease_ttl_s=ttl, clock=lambda: now[0], max_leases_per_peer=6)
    # One engine process per peer: its writer lock lives while it does.
    writers = {peer: ArenaMapping(store.arena.name, str(tmp_path)) for peer in ("e0", "e1")}
    live = []  # prepared puts: (ns, ctx, lease, slots, peer)
    late = []  # expired puts whose writer is still running: (ns, ctx, lease, slots, peer)
    contexts = {ns: [] for ns in NAMESPACES}
    refused = committed = late_writes = deaths = newest = 0

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
                    writer=writers[peer].writer_id,
                )
            except LeaseLimit:
                continue
            live.append((ns, ctx, lease, slots, peer))
            contexts[ns].append(ctx)
            newest = store.lease_generation(lease)
        elif op < 0.42 and live:  # write (all, part, none) and commit
            ns, ctx, lease, slots, _ = live.pop(rng.randrange(len(live)))
            write(ns, ctx, slots, rng.choice([1.0, 1.0, 1.0, 0.5, 0.0]))
            counts = commit_checked(store, ns, ctx, lease, slots)
            refused += counts is None and store.put_slots(lease) is None and bool(slots)
            committed += counts is not None
        elif op < 0.52:  # a whole put over gRPC (evicts when full)
            ctx = context(ns)
            put(
                store,
                ns,
                ctx,
                local_blocks=set(range(max(0, len(ctx) // 4 - 2), len(ctx) // 4)),
                owner=rng.choice(["", "c1", "c2"]),
            )
            contexts[ns].append(ctx)
        elif op < 0.62:  # time passes (up to several TTLs): leases expire, their writers may still write
            now[0] += rng.uniform(0.5, 3.0 * ttl)
            store.expire_leases()
            for entry in list(live):
                if store.revoked(entry[2]):
                    live.remove(entry)
                    late.append(entry)
            store.release_quarantine()
        elif op < 0.72 and late:  # a late writer finishes, however late, then commits (refused) or releases
            ns, ctx, lease, slots, _ = late.pop(rng.randrange(len(late)))
            write(ns, ctx, slots, 1.0)
            late_writes += 1
            if rng.random() < 0.5:
                assert commit_checked(store, ns, ctx, lease, slots) is None
            else:
                assert not store.release_lease(lease)
            assert not store.revoked(lease)
        elif op < 0.75:  # a writer reports its progress: its oldest write still running bounds it
            peer = rng.choice(["e0", "e1"])
            running = [store.lease_generation(e[2]) for e in late + live if e[4] == peer]
            store.writer_progress(writers[peer].writer_id, min(running, default=newest + 1))
        elif op < 0.77:  # an engine dies: it writes nothing more; a new one takes its place
            peer = rng.choice(["e0", "e1"])
            late = [e for e in late if e[4] != peer]
            live = [e for e in live if e[4] != peer]
            writers[peer].close()
            writers[peer] = ArenaMapping(store.arena.name, str(tmp_path))
            deaths += 1
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
    assert committed > 20 and refused > 5 and late_writes > 3 and deaths > 3, (committed, refused, late_writes, deaths)
    for writer in writers.values():
        writer.close()


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


def test_over_grpc_an_unwritten_slot_with_the_checksum_of_zeros_is_refused(small_store) -> None:
    ctx = list(range(300, 316))
    with grpc.insecure_channel(small_store.target) as channel:
        stub = pb_grpc.KVStoreServiceStub(channel)
        prepared = _prepare(stub, NS_C, ctx, 4)
        arena = np.memmap(prepared.shm_name, np.uint8, "r+")
        # Blocks 0, 1 and 3 written; block 2 claimed with the CRC of zeros, then with the CRC of what it holds.
        crc = []
        for s in prepared.slots:
            data = payload(NS_C, ctx, s.block_index, "g", 64, 4)
            if s.block_index != 2:
                arena[s.global_offset : s.global_offset + 64] = np.frombuffer(data, np.uint8)
            crc.append(zlib.crc32(data))
        arena.flush()
        offset = prepared.slots[2].global_offset
        for zeros in (True, False):
            held = arena[offset : offset + 64].tobytes()  # the lease's canary
            claim = zlib.crc32(bytes(64) if zeros else held)
            why = "is not what was written" if zeros else "was never written"
            with pytest.raises(grpc.RpcError) as info:
                stub.CommitSharedPut(
                    pb.CommitSharedPutRequest(lease_id=prepared.lease_id, global_crc32=[*crc[:2], claim, crc[3]])
                )
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"block 2: the global KV at offset {offset} {why}" in info.value.details()
            assert "nothing was stored" in info.value.details()
            fetch = pb.FetchRequest(
                namespace=NS_C, token_ids_le32=encode_token_ids(ctx), layout=layout_to_proto(LAYOUT)
            )
            assert [m.header.num_tokens for m in stub.Fetch(fetch) if m.HasField("header")] == [0]
            prepared = _prepare(stub, NS_C, ctx, 4)  # the refusal ended the lease: a new one, same slots
            assert prepared.slots[2].global_offset == offset
            for s in prepared.slots:
                if s.block_index != 2:
                    data = payload(NS_C, ctx, s.block_index, "g", 64, 4)
                    arena[s.global_offset : s.global_offset + 64] = np.frombuffer(data, np.uint8)
        assert stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=prepared.lease_id)).released
