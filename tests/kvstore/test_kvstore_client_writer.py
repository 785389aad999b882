"""The engines' client as a writer: it tells the kvstore when it is done with a put lease, never before.

A put whose caller is cancelled while its worker thread writes leaves the lease to expire; the kvstore
keeps the space quarantined while the thread runs, and the client releases the lease once the thread
ends. The progress a writer reports (writes_done_below_generation) never covers a lease it may still
write: seeded random interleavings of prepares sent, granted (in any order), refused, and writes ended.
"""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
from kvstore_testlib import NS_A, KVStoreProcess, block_rows

from salon.common.kvstore_contract import client as client_module
from salon.common.kvstore_contract.client import INLINE_WRITE_BYTES, _WriterProgress
from salon.common.kvstore_contract.layout import KVLayout

BIG = KVLayout(4, 64 << 10, 0, 0)  # 64 KiB blocks: a 32-block put is written in a worker thread


async def _until(condition, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_a_cancelled_put_releases_its_lease_only_after_its_write_thread_ends(tmp_path, monkeypatch) -> None:
    proc = KVStoreProcess(tmp_path, capacity_bytes=8 << 20, lease_ttl_s=2.0)
    stalled, resume = threading.Event(), threading.Event()
    real_write = client_module._write_and_checksum

    def stalling_write(*args):
        stalled.set()
        resume.wait(60)
        return real_write(*args)

    monkeypatch.setattr(client_module, "_write_and_checksum", stalling_write)
    client = await proc.client(use_shared_memory=True, timeout_s=5.0)
    try:
        ctx = list(range(128))
        rows = block_rows(NS_A, ctx, range(32), BIG.global_bytes_per_block, "g", 4)
        assert rows.nbytes > INLINE_WRITE_BYTES
        put = asyncio.create_task(client.put(NS_A, ctx, BIG, rows))
        assert await asyncio.to_thread(stalled.wait, 30)
        put.cancel()  # the caller gives up; the thread keeps writing
        with pytest.raises(asyncio.CancelledError):
            await put
        # The lease expires while the thread is stalled: its space is quarantined, not freed.
        await _until(lambda: _stats_match(client, quarantined_bytes=rows.nbytes, num_leases=0))
        resume.set()  # the write ends: the client releases the lease, and the kvstore frees the space
        await _until(lambda: _stats_match(client, quarantined_bytes=0, num_leases=0, used_bytes=0))
    finally:
        resume.set()
        await client.close()
        assert proc.stop() == 0


async def _stats_match(client, **expected) -> bool:
    stats = await client.stats()
    return stats is not None and all(getattr(stats, k) == v for k, v in expected.items())


@pytest.mark.parametrize("seed", range(8))
def test_progress_never_covers_a_lease_that_may_still_be_written(seed) -> None:
    rng = random.Random(seed)
    progress = _WriterProgress()
    server_generation = 0
    in_flight: list[tuple[int, int | None]] = []  # (ask, generation once the kvstore granted it)
    writing: set[int] = set()  # generations whose write may still run
    reports = 0
    for _ in range(3000):
        op = rng.random()
        if op < 0.3:  # a prepare is sent, carrying a report
            done_below = progress.done_below()
            assert all(g >= done_below for g in writing), (seed, done_below, writing)
            assert all(g is None or g >= done_below for _, g in in_flight), (seed, done_below)
            in_flight.append((progress.asking(), None))
            reports += 1
        elif op < 0.5 and in_flight:  # the kvstore grants one (generations ascend in its order)
            i = rng.randrange(len(in_flight))
            if in_flight[i][1] is None:
                server_generation += 1
                in_flight[i] = (in_flight[i][0], server_generation)
        elif op < 0.7 and in_flight:  # a reply reaches the client: granted, or refused / lost
            ask, generation = in_flight.pop(rng.randrange(len(in_flight)))
            if generation is not None and rng.random() < 0.8:
                progress.granted(ask, generation)
                writing.add(generation)
            else:
                progress.refused(ask)  # the client never saw a lease: it writes nothing of it
        elif op < 0.9 and writing:  # a write ends
            generation = rng.choice(sorted(writing))
            writing.remove(generation)
            progress.done(generation)
        done_below = progress.done_below()
        assert all(g >= done_below for g in writing)
        assert all(g is None or g >= done_below for _, g in in_flight)
    assert reports > 500 and server_generation > 300
    while writing:
        progress.done(writing.pop())
    for ask, _ in in_flight:
        progress.refused(ask)
    assert progress.done_below() == progress.max_granted + 1  # nothing outstanding: everything so far is done
