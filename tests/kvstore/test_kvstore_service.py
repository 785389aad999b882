"""The kvstore as a real process over gRPC on loopback, through the engines' client."""

from __future__ import annotations

import asyncio
import random

import grpc
import numpy as np
import pytest
from kvstore_testlib import NS_A, NS_B, KVStoreProcess, block_rows

from salon.api.kvstore.v1 import kvstore_pb2 as pb
from salon.api.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from salon.common.kvstore_contract.client import KVStoreClient, layout_to_proto
from salon.common.kvstore_contract.layout import KVLayout, MatchResult
from salon.common.prefix_hash import encode_token_ids

# The default model's sizes: 16-token blocks, 3 global + 15 sliding layers of 520 B per token.
GEMMA = KVLayout(16, 3 * 16 * 520, 15 * 16 * 520, 512)
SMALL = KVLayout(4, 256, 512, 9)  # window_blocks = 2


@pytest.fixture(scope="module")
def kvstore(tmp_path_factory):
    proc = KVStoreProcess(tmp_path_factory.mktemp("shm"), capacity_bytes=64 << 20, lease_ttl_s=2.0)
    yield proc
    assert proc.stop() == 0


def rows(ns, ctx, layout, blocks, kind):
    size = layout.global_bytes_per_block if kind == "g" else layout.local_bytes_per_block
    return block_rows(ns, ctx, list(blocks), size, kind, layout.block_size_tokens)


def check_fetch(result, ns, ctx, layout, expect_tokens, from_block=0):
    num_blocks = expect_tokens // layout.block_size_tokens
    assert result.num_tokens == expect_tokens
    assert result.first_global_block == min(from_block, num_blocks)
    np.testing.assert_array_equal(
        result.global_kv, rows(ns, ctx, layout, range(result.first_global_block, num_blocks), "g")
    )
    assert result.local_from_block == num_blocks - layout.needed_local_blocks(num_blocks)
    np.testing.assert_array_equal(
        result.local_kv, rows(ns, ctx, layout, range(result.local_from_block, num_blocks), "l")
    )


@pytest.mark.parametrize("put_shm,fetch_shm", [(False, False), (True, True), (False, True), (True, False)])
async def test_round_trip_gemma_sizes(kvstore, put_shm, fetch_shm) -> None:
    rng = random.Random(int(put_shm) * 2 + int(fetch_shm))
    ns = bytes([rng.randrange(256) for _ in range(32)])
    ctx = [rng.randrange(262144) for _ in range(1030)]  # 64 whole blocks + 6 tokens
    writer = await kvstore.client(use_shared_memory=put_shm)
    reader = await kvstore.client(use_shared_memory=fetch_shm)
    try:
        locals_from = 64 - 40  # local KV for the last 40 blocks (window before the last message + reply)
        put = await writer.put(
            ns,
            ctx,
            GEMMA,
            rows(ns, ctx, GEMMA, range(64), "g"),
            rows(ns, ctx, GEMMA, range(locals_from, 64), "l"),
            local_first_block=locals_from,
            conversation_id="conv-1",
        )
        assert (put.stored_blocks, put.existing_blocks, put.skipped_blocks) == (64, 0, 0)
        assert await reader.match(ns, ctx, GEMMA) == MatchResult(1024, 1024)
        edited = ctx[:1000] + [7] * 30  # edit inside block 62: the prefix up to block 62 is usable
        assert await reader.match(ns, edited, GEMMA) == MatchResult(992, 992)
        early = ctx[:400] + [7] * 30  # block 25: needs local KV of blocks 0..24, only 24.. stored
        assert await reader.match(ns, early, GEMMA) == MatchResult(400, 0)
        result = await reader.fetch(ns, ctx, GEMMA)
        assert result.transport == ("shared_memory" if fetch_shm else "grpc")
        check_fetch(result, ns, ctx, GEMMA, 1024)
        partial = await reader.fetch(ns, edited, GEMMA, from_block=50)
        check_fetch(partial, ns, ctx, GEMMA, 992, from_block=50)
        again = await writer.put(ns, ctx, GEMMA, rows(ns, ctx, GEMMA, range(64), "g"))
        assert (again.stored_blocks, again.existing_blocks) == (0, 64)
    finally:
        await writer.close()
        await reader.close()


async def test_bad_requests_name_the_field(kvstore) -> None:
    async with grpc.aio.insecure_channel(kvstore.target) as channel:
        stub = pb_grpc.KVStoreServiceStub(channel)
        layout = layout_to_proto(SMALL)
        cases = [
            (pb.MatchRequest(namespace=b"", token_ids_le32=b"", layout=layout), "namespace"),
            (pb.MatchRequest(namespace=NS_A, token_ids_le32=b"abc", layout=layout), "token_ids_le32"),
            (pb.MatchRequest(namespace=NS_A, layout=pb.KVLayout(block_size_tokens=4)), "layout.global_bytes_per_block"),
        ]
        for request, field in cases:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Match(request)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in info.value.details()

        async def chunk_first():
            yield pb.PutRequest(chunk=pb.KVChunk(global_kv=b"x" * 256))

        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Put(chunk_first())
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "header" in info.value.details()

        async def ragged():
            yield pb.PutRequest(
                header=pb.PutHeader(namespace=NS_A, token_ids_le32=encode_token_ids(range(8)), layout=layout)
            )
            yield pb.PutRequest(chunk=pb.KVChunk(global_kv=b"x" * 100))

        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Put(ragged())
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "global_kv" in info.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CommitSharedPut(pb.CommitSharedPutRequest(lease_id="nope"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and "lease_id" in info.value.details()
        other = pb.KVLayout(
            block_size_tokens=4, global_bytes_per_block=128, local_bytes_per_block=512, sliding_window_tokens=9
        )
        client = KVStoreClient(kvstore.target)
        await client.put(NS_B, list(range(8)), SMALL, np.zeros((2, 256), np.uint8))
        await client.close()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Match(pb.MatchRequest(namespace=NS_B, token_ids_le32=encode_token_ids(range(8)), layout=other))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "layout" in info.value.details()


async def test_namespace_isolation_and_drop(kvstore) -> None:
    client = await kvstore.client(use_shared_memory=True)
    ns1, ns2 = b"\x01" * 32, b"\x02" * 32
    ctx = list(range(1000, 1016))
    try:
        await client.put(
            ns1,
            ctx,
            SMALL,
            rows(ns1, ctx, SMALL, range(4), "g"),
            rows(ns1, ctx, SMALL, range(2, 4), "l"),
            local_first_block=2,
            conversation_id="c1",
        )
        assert await client.match(ns1, ctx, SMALL) == MatchResult(16, 16)
        assert await client.match(ns2, ctx, SMALL) == MatchResult(0, 0)
        assert (await client.fetch(ns2, ctx, SMALL)).num_tokens == 0
        assert await client.drop(ns1, "other") == 0
        assert await client.drop(ns1, "c1") == 4
        assert await client.match(ns1, ctx, SMALL) == MatchResult(0, 0)
    finally:
        await client.close()


async def test_many_puts_and_fetches_in_flight(tmp_path) -> None:
    """64 dialogues on 4 clients, in a store that holds about a third of them: every fetch returns
    exactly its own prefix's bytes or a miss, with puts and fetches interleaved in flight.

    Three rounds run every dialogue's fetch-then-put turn at once, so fetches race puts that evict.
    How many of those fetches hit depends on the interleaving (turns that run one after another in
    the dialogues' cyclic order hit nothing under LRU), so they are checked for bytes only. Two more
    rounds fetch every dialogue at once and then put every dialogue at once: after a wave of puts the
    store holds the most recent ~160 KB of them (at most ~6 KB a dialogue), so each fetch wave must
    hit at least 20 dialogues whatever the order within the waves."""
    proc = KVStoreProcess(tmp_path, capacity_bytes=160_000)
    clients = [await proc.client(use_shared_memory=i % 2 == 0) for i in range(4)]
    rng = random.Random(3)
    prefix = [rng.randrange(5000) for _ in range(32)]  # a shared character definition
    dialogues = [prefix + [rng.randrange(5000) for _ in range(rng.randrange(8, 40))] for _ in range(64)]
    replies = [random.Random(1000 + d) for d in range(64)]  # each dialogue's own stream: the same tokens in any order

    async def fetch(d: int, t: int) -> bool:
        ctx = dialogues[d]
        result = await clients[(d + t) % 4].fetch(NS_A, ctx, SMALL)
        if result.num_tokens:
            check_fetch(result, NS_A, ctx, SMALL, result.num_tokens)
        return result.num_tokens > 0

    async def put(d: int, t: int) -> None:
        ctx = dialogues[d]
        n = len(ctx) // 4
        await clients[(d + t + 1) % 4].put(
            NS_A,
            ctx,
            SMALL,
            rows(NS_A, ctx, SMALL, range(n), "g"),
            rows(NS_A, ctx, SMALL, range(n - 3, n), "l"),
            local_first_block=n - 3,
            conversation_id=f"d{d}",
        )
        dialogues[d] = ctx + [replies[d].randrange(5000) for _ in range(12)]

    async def turn(d: int, t: int) -> None:
        await fetch(d, t)
        await put(d, t)

    try:
        for t in range(3):
            await asyncio.gather(*(turn(d, t) for d in range(64)))
        wave_hits = []
        for t in range(3, 5):
            wave_hits.append(sum(await asyncio.gather(*(fetch(d, t) for d in range(64)))))
            await asyncio.gather(*(put(d, t) for d in range(64)))
        stats = await clients[0].stats()
        assert min(wave_hits) >= 20, wave_hits
        assert stats.evicted_blocks > 0 and stats.used_bytes <= stats.capacity_bytes
        for client in clients:
            await client.close()
        assert await _leases_reach_zero(KVStoreClient(proc.target), timeout_s=10.0)
    finally:
        for client in clients:
            await client.close()
        assert proc.stop() == 0


async def _leases_reach_zero(client: KVStoreClient, timeout_s: float) -> bool:
    """Polls the kvstore's lease count until it is 0 (True) or `timeout_s` passes (False)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await client.stats()).num_leases != 0:
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_restart_gives_misses_then_recovers(tmp_path) -> None:
    proc = KVStoreProcess(tmp_path, capacity_bytes=8 << 20)
    port = proc.port
    client = await proc.client(use_shared_memory=True, timeout_s=1.0)
    ctx = list(range(64))
    g, loc = rows(NS_A, ctx, SMALL, range(16), "g"), rows(NS_A, ctx, SMALL, range(14, 16), "l")
    try:
        await client.put(NS_A, ctx, SMALL, g, loc, local_first_block=14)
        first = await client.stats()
        assert (await client.fetch(NS_A, ctx, SMALL)).num_tokens == 64
        proc.kill()
        # Dead store: misses, no exceptions.
        assert await client.match(NS_A, ctx, SMALL) == MatchResult(0, 0)
        assert (await client.fetch(NS_A, ctx, SMALL)).num_tokens == 0
        assert await client.put(NS_A, ctx, SMALL, g) is None
        proc = KVStoreProcess(tmp_path, capacity_bytes=8 << 20, port=port)
        for _ in range(50):  # the channel reconnects by itself (backoff <= 1 s)
            stats = await client.stats(timeout_s=0.5)
            if stats is not None:
                break
            await asyncio.sleep(0.1)
        assert stats.started_at_unix_ms > first.started_at_unix_ms and stats.num_blocks == 0
        assert await client.match(NS_A, ctx, SMALL) == MatchResult(0, 0)  # empty after restart
        assert len(list(tmp_path.glob("salon-kvstore-*"))) == 1  # the dead process's arena was removed
        old_arena = client._arena.name
        put = await client.put(NS_A, ctx, SMALL, g, loc, local_first_block=14)  # over gRPC: the arena changed
        assert put.stored_blocks == 16
        assert await client.map_arena() and client._arena.name != old_arena  # mapped off the loop meanwhile
        result = await client.fetch(NS_A, ctx, SMALL)
        assert result.transport == "shared_memory"
        check_fetch(result, NS_A, ctx, SMALL, 64)
    finally:
        await client.close()
        proc.stop()


async def test_unreleased_lease_expires(kvstore) -> None:
    ctx = list(range(5000, 5016))
    client = KVStoreClient(kvstore.target)
    await client.put(
        NS_A,
        ctx,
        SMALL,
        rows(NS_A, ctx, SMALL, range(4), "g"),
        rows(NS_A, ctx, SMALL, range(2, 4), "l"),
        local_first_block=2,
    )
    async with grpc.aio.insecure_channel(kvstore.target) as channel:
        stub = pb_grpc.KVStoreServiceStub(channel)
        request = pb.FetchRequest(
            namespace=NS_A,
            token_ids_le32=encode_token_ids(ctx),
            layout=layout_to_proto(SMALL),
            transport=pb.TRANSPORT_SHARED_MEMORY,
        )
        [response] = [m async for m in stub.Fetch(request)]
        assert response.header.num_tokens == 16 and len(response.header.global_offsets) == 4
        assert response.header.lease_ttl_ms == 2000
        assert (await client.stats()).num_leases == 1
        started = asyncio.get_running_loop().time()
        assert await _leases_reach_zero(client, timeout_s=10.0)  # TTL 2 s, swept every 0.5 s
        assert asyncio.get_running_loop().time() - started >= 1.0  # expired by its TTL, not at once
        assert not (await stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=response.header.lease_id))).released
    await client.close()


@pytest.mark.parametrize("shm", [False, True])
async def test_put_from_a_later_block(kvstore, shm) -> None:
    """An engine may send only the blocks after what it knows is stored; a missing parent stores nothing."""
    ns = bytes([7 + shm]) * 32
    ctx = list(range(9000, 9032))  # 8 blocks
    client = await kvstore.client(use_shared_memory=shm)
    try:
        first = await client.put(ns, ctx[:16], SMALL, rows(ns, ctx, SMALL, range(4), "g"))
        assert first.stored_blocks == 4
        more = await client.put(
            ns,
            ctx,
            SMALL,
            rows(ns, ctx, SMALL, range(4, 8), "g"),
            rows(ns, ctx, SMALL, range(6, 8), "l"),
            first_block=4,
            local_first_block=6,
        )
        assert (more.stored_blocks, more.skipped_blocks) == (4, 0)
        check_fetch(await client.fetch(ns, ctx, SMALL), ns, ctx, SMALL, 32)
        orphan = [1] * 16 + ctx[16:]
        lost = await client.put(ns, orphan, SMALL, rows(ns, orphan, SMALL, range(4, 8), "g"), first_block=4)
        assert lost.stored_blocks == 0
        assert await client.match(ns, orphan, SMALL) == MatchResult(0, 0)
        with pytest.raises(ValueError, match="local_kv"):
            await client.put(
                ns,
                ctx,
                SMALL,
                rows(ns, ctx, SMALL, range(4, 8), "g"),
                rows(ns, ctx, SMALL, range(2, 4), "l"),
                first_block=4,
                local_first_block=2,
            )
    finally:
        await client.close()
