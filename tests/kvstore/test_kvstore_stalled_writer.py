"""A writer that stalls past its put lease, against a real kvstore process with short leases.

The engine writes into the shared arena itself, so nothing stops a stalled writer (SIGSTOP, a descheduled
thread) from writing long after its lease expired. The kvstore keeps the lease's space out of use until
the writer is provably done: here the writer comes back after several lease lengths, scribbles its own
namespace's bytes into its old slots, and every fetch of the other namespace still returns that
namespace's exact bytes; the late commit is refused (FAILED_PRECONDITION) and only then is the space
freed. A writer whose process dies frees its space by dying (its writer lock goes with it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zlib

import grpc
import numpy as np
import pytest
from kvstore_testlib import LAYOUT, NS_A, NS_B, REPO_ROOT, KVStoreProcess, payload

from salon.api.kvstore.v1 import kvstore_pb2 as pb
from salon.api.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from salon.common.kvstore_contract.arena_mapping import ArenaMapping
from salon.common.kvstore_contract.client import layout_to_proto
from salon.common.prefix_hash import encode_token_ids

TTL_S = 1.0
BLOCKS = 8
GB = LAYOUT.global_bytes_per_block  # 64: one alignment unit per block
LB = LAYOUT.local_bytes_per_block  # 128
CAPACITY = 64 * GB  # the writer's 8 blocks and room for 5 more contexts of 8


def _prepare(stub, ns, ctx, writer_id: int, done_below: int = 0):
    header = pb.PutHeader(namespace=ns, token_ids_le32=encode_token_ids(ctx), layout=layout_to_proto(LAYOUT))
    return stub.PrepareSharedPut(
        pb.PrepareSharedPutRequest(
            header=header, num_blocks=len(ctx) // 4, writer_id=writer_id, writes_done_below_generation=done_below
        )
    )


def _put_grpc(stub, ns, ctx) -> None:
    """Global KV of every block and local KV of the last (what makes the whole context usable)."""
    n = len(ctx) // 4
    header = pb.PutHeader(namespace=ns, token_ids_le32=encode_token_ids(ctx), layout=layout_to_proto(LAYOUT))
    chunk = pb.KVChunk(
        global_kv=b"".join(payload(ns, ctx, i, "g", GB, 4) for i in range(n)),
        first_local_block_index=n - 1,
        local_kv=payload(ns, ctx, n - 1, "l", LB, 4),
    )
    stub.Put(iter([pb.PutRequest(header=header), pb.PutRequest(chunk=chunk)]))


def _poll(condition, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture
def store(tmp_path):
    proc = KVStoreProcess(tmp_path, capacity_bytes=CAPACITY, lease_ttl_s=TTL_S)
    yield proc
    assert proc.stop() == 0


def test_a_stalled_writer_never_exposes_its_bytes_in_another_namespace(store) -> None:
    ctx_a = list(range(BLOCKS * 4))
    with grpc.insecure_channel(store.target) as channel:
        stub = pb_grpc.KVStoreServiceStub(channel)
        writer = ArenaMapping(stub.GetStats(pb.GetStatsRequest()).shm_name, store.shm_dir)
        prepared = _prepare(stub, NS_A, ctx_a, writer.writer_id)
        assert len(prepared.slots) == BLOCKS and prepared.generation > 0
        held = [(s.global_offset, s.global_offset + GB) for s in prepared.slots]
        # The writer stalls: its lease expires and its space is quarantined.
        _poll(lambda: stub.GetStats(pb.GetStatsRequest()).quarantined_bytes == BLOCKS * GB)
        expired_at = time.monotonic()
        # Another namespace fills the arena over and over for three lease lengths past the expiry (a
        # time-limited quarantine would have handed the stalled writer's space out by then).
        contexts = []
        while time.monotonic() < expired_at + 3 * TTL_S or len(contexts) < 24:
            ctx = [10_000 + len(contexts), *range(BLOCKS * 4 - 1)]
            _put_grpc(stub, NS_B, ctx)
            contexts.append(ctx)
        stats = stub.GetStats(pb.GetStatsRequest())
        # Full (less free than one context): every byte that was free got reused.
        assert CAPACITY - stats.used_bytes < BLOCKS * GB + LB and stats.evicted_blocks > 0
        # The writer wakes up and writes what it meant to: its namespace's bytes, into its old slots.
        for slot in prepared.slots:
            writer.array[slot.global_offset : slot.global_offset + GB] = np.frombuffer(
                payload(NS_A, ctx_a, slot.block_index, "g", GB, 4), np.uint8
            )
        # Every block of the other namespace is still exactly its own (over gRPC: the bytes; over shared
        # memory: the offsets lie outside the stalled writer's slots).
        fetched = 0
        for ctx in contexts[-24:]:  # the older ones are evicted
            request = pb.FetchRequest(
                namespace=NS_B, token_ids_le32=encode_token_ids(ctx), layout=layout_to_proto(LAYOUT)
            )
            messages = list(stub.Fetch(request))
            head = messages[0].header
            num_blocks = head.num_tokens // 4
            assert b"".join(m.chunk.global_kv for m in messages[1:]) == b"".join(
                payload(NS_B, ctx, i, "g", GB, 4) for i in range(num_blocks)
            )
            assert b"".join(m.chunk.local_kv for m in messages[1:]) == b"".join(
                payload(NS_B, ctx, i, "l", LB, 4) for i in range(head.local_from_block_index, num_blocks)
            )
            fetched += num_blocks
            request.transport = pb.TRANSPORT_SHARED_MEMORY
            header = next(iter(stub.Fetch(request))).header
            for offset in [*header.global_offsets, *header.local_offsets]:
                assert not any(a <= offset < b for a, b in held), offset
            if header.lease_id:
                stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=header.lease_id))
        assert fetched >= 3 * BLOCKS  # positive control: the stored contexts were read back
        # The late commit is refused with a clear status (even with the right checksums); that ends the
        # quarantine, and nothing of the writer's namespace is stored.
        crc = [zlib.crc32(payload(NS_A, ctx_a, s.block_index, "g", GB, 4)) for s in prepared.slots]
        with pytest.raises(grpc.RpcError) as info:
            stub.CommitSharedPut(pb.CommitSharedPutRequest(lease_id=prepared.lease_id, global_crc32=crc))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "expired before this commit" in info.value.details() and "nothing was stored" in info.value.details()
        stats = stub.GetStats(pb.GetStatsRequest())
        assert stats.quarantined_bytes == 0 and stats.num_leases == 0
        request = pb.FetchRequest(
            namespace=NS_A, token_ids_le32=encode_token_ids(ctx_a), layout=layout_to_proto(LAYOUT)
        )
        assert next(iter(stub.Fetch(request))).header.num_tokens == 0
        # Committing it again: the lease is gone for good.
        with pytest.raises(grpc.RpcError) as info:
            stub.CommitSharedPut(pb.CommitSharedPutRequest(lease_id=prepared.lease_id, global_crc32=crc))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    writer.close()


def test_a_dead_writers_quarantine_ends_with_its_process(store) -> None:
    with grpc.insecure_channel(store.target) as channel:
        stub = pb_grpc.KVStoreServiceStub(channel)
        shm_name = stub.GetStats(pb.GetStatsRequest()).shm_name
        code = (
            "import sys, time\n"
            "from salon.common.kvstore_contract.arena_mapping import ArenaMapping\n"
            "m = ArenaMapping(sys.argv[1], sys.argv[2])\n"
            "print(m.writer_id, flush=True)\n"
            "time.sleep(600)\n"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        engine = subprocess.Popen(
            [sys.executable, "-c", code, shm_name, store.shm_dir], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            writer_id = int(engine.stdout.readline())
            prepared = _prepare(stub, NS_A, list(range(16)), writer_id)  # accepted: the lock is held
            assert len(prepared.slots) == 4
            _poll(lambda: stub.GetStats(pb.GetStatsRequest()).quarantined_bytes == 4 * GB)
            engine.kill()
            engine.wait(10)
            _poll(lambda: stub.GetStats(pb.GetStatsRequest()).quarantined_bytes == 0)
            assert stub.GetStats(pb.GetStatsRequest()).used_bytes == 0
            # A writer lock nobody holds: refused before anything is reserved.
            with pytest.raises(grpc.RpcError) as info:
                _prepare(stub, NS_A, list(range(16)), writer_id)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"no process holds writer lock {writer_id}" in info.value.details()
            assert stub.GetStats(pb.GetStatsRequest()).used_bytes == 0
        finally:
            if engine.poll() is None:
                engine.kill()
                engine.wait(10)
            engine.stdout.close()


def test_a_live_writers_progress_frees_the_leases_below_it(store) -> None:
    with grpc.insecure_channel(store.target) as channel:
        stub = pb_grpc.KVStoreServiceStub(channel)
        writer = ArenaMapping(stub.GetStats(pb.GetStatsRequest()).shm_name, store.shm_dir)
        lost = _prepare(stub, NS_A, list(range(16)), writer.writer_id)  # a reply its writer never saw
        _poll(lambda: stub.GetStats(pb.GetStatsRequest()).quarantined_bytes == 4 * GB)
        # The writer's next prepare says nothing below lost.generation + 1 is being written: freed.
        nxt = _prepare(stub, NS_A, list(range(100, 108)), writer.writer_id, done_below=lost.generation + 1)
        assert nxt.generation > lost.generation
        stats = stub.GetStats(pb.GetStatsRequest())
        assert stats.quarantined_bytes == 0 and stats.used_bytes == 2 * GB  # only the new lease's slots
        stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=nxt.lease_id))
    writer.close()
