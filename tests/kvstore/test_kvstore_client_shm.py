"""The engines' side of shared memory, against a real kvstore process: the arena is mapped ahead of time
in a worker thread (never on the event loop), and a put never starts writing into a lease that is too
close to its end."""

from __future__ import annotations

import asyncio
import threading

from kvstore_testlib import NS_A, KVStoreProcess, block_rows

from salon.common.kvstore_contract import client as client_module
from salon.common.kvstore_contract.layout import KVLayout

SMALL = KVLayout(4, 256, 512, 9)


async def test_the_arena_is_mapped_ahead_of_time_off_the_event_loop(tmp_path, monkeypatch) -> None:
    proc = KVStoreProcess(tmp_path, capacity_bytes=1 << 20)
    threads = []
    real = client_module.ArenaMapping

    def recording(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(client_module, "ArenaMapping", recording)
    client = client_module.KVStoreClient(proc.target, use_shared_memory=True, arena_dir=str(tmp_path))
    try:
        client.start()
        for _ in range(100):  # before any transfer asks for it
            if client.arena_mapped:
                break
            await asyncio.sleep(0.05)
        assert client.arena_mapped
        assert threads and all(t is not threading.main_thread() for t in threads)
        ctx = list(range(16))
        rows = block_rows(NS_A, ctx, range(4), 256, "g", 4)
        local = block_rows(NS_A, ctx, range(2, 4), 512, "l", 4)
        assert (await client.put(NS_A, ctx, SMALL, rows, local, local_first_block=2)).stored_blocks == 4
        fetched = await client.fetch(NS_A, ctx, SMALL)
        assert fetched.transport == "shared_memory" and fetched.num_tokens == 16
        assert len(threads) == 1  # mapped once
    finally:
        await client.close()
        proc.stop()


async def test_a_put_never_writes_into_a_lease_too_close_to_its_end(tmp_path, monkeypatch) -> None:
    # Leases of 0.5 s: less than the margin (LEASE_MARGIN_S = 1 s) a write must leave before the end.
    proc = KVStoreProcess(tmp_path, capacity_bytes=1 << 20, lease_ttl_s=0.5)
    writes = []
    monkeypatch.setattr(client_module, "_write_and_checksum", lambda *a: writes.append(a) or ([], []))
    client = await proc.client(use_shared_memory=True)
    try:
        ctx = list(range(100, 116))
        rows = block_rows(NS_A, ctx, range(4), 256, "g", 4)
        assert await client.put(NS_A, ctx, SMALL, rows) is None  # refused before writing: nothing stored
        assert writes == []
        stats = await client.stats()
        assert stats.num_leases == 0 and stats.quarantined_bytes == 0  # released at once, not left to expire
        assert (await client.match(NS_A, ctx, SMALL)).matched_tokens == 0
    finally:
        await client.close()
        proc.stop()
