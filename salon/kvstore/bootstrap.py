"""The kvstore as a `Service` for the shared bootstrap: arena + tree + store + servicer + lease sweeper.

It is a cache: it starts empty (started_at_unix_ms tells clients a restart happened) and keeps
nothing on stop. The arena file is removed on stop, and arenas no process holds locked on start. The
shared-memory directory must be this user's and 0700 (shm_dir.py), else the start fails naming it.
Only engine identities may call it (access_policy; mutual TLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc

from salon.api.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from salon.common import namespace_grant
from salon.common.logging import get_logger
from salon.common.peer_identity import AccessPolicy
from salon.common.server import HealthState
from salon.kvstore import metrics
from salon.kvstore.allocator import ExtentAllocator
from salon.kvstore.arena import Arena, remove_stale_arenas
from salon.kvstore.config import KVStoreConfig
from salon.kvstore.radix_tree import RadixTree
from salon.kvstore.servicer import KVStoreServicer
from salon.kvstore.shm_dir import check_shm_dir
from salon.kvstore.store import KVStore

log = get_logger(__name__)

LEASE_SWEEP_INTERVAL_S = 0.5


class KVStoreService:
    name = "kvstore"
    access_policy = AccessPolicy({"/salon.kvstore.v1.KVStoreService/": frozenset({"engine"})})

    def __init__(self, config: KVStoreConfig) -> None:
        self.config = config
        self.started_at_unix_ms = int(time.time() * 1000)
        self.store: KVStore | None = None
        self._sweeper: asyncio.Task | None = None

    async def start(self, server: grpc.aio.Server, health: HealthState) -> list[str]:
        config = self.config
        check_shm_dir(config.shm_dir)
        grant_key = (
            namespace_grant.load_key(config.namespace_grant_key_file) if config.namespace_grant_key_file else None
        )
        if grant_key is None:
            log.warning("namespace_grants_off", detail="Put and Drop accept any namespace an engine names")
        for path in remove_stale_arenas(config.shm_dir):
            log.info("removed_stale_arena", path=str(path))
        capacity_bytes = ExtentAllocator(config.capacity_bytes).capacity_bytes
        arena = await asyncio.to_thread(Arena, config.shm_dir, capacity_bytes)
        tree = RadixTree(capacity_bytes, on_free=arena.zero)
        self.store = store = KVStore(tree, arena, config.lease_ttl_s, max_leases_per_peer=config.max_leases_per_peer)
        servicer = KVStoreServicer(store, self.started_at_unix_ms, config.fetch_chunk_bytes, grant_key)
        kvstore_pb2_grpc.add_KVStoreServiceServicer_to_server(servicer, server)
        metrics.CAPACITY_BYTES.set(tree.capacity_bytes)
        metrics.USED_BYTES.set_function(lambda: tree.used_bytes)
        metrics.BLOCKS.set_function(lambda: tree.num_blocks)
        metrics.LOCAL_BLOCKS.set_function(lambda: tree.stats().num_local_blocks)
        metrics.LEASES.set_function(lambda: store.num_leases)
        metrics.QUARANTINED_BYTES.set_function(lambda: store.quarantined_bytes)
        self._sweeper = asyncio.create_task(self._sweep_leases())
        await health.set_serving()
        log.info(
            "kvstore_ready",
            capacity_bytes=tree.capacity_bytes,
            arena=arena.name,
            started_at_unix_ms=self.started_at_unix_ms,
        )
        return [kvstore_pb2.DESCRIPTOR.services_by_name["KVStoreService"].full_name]

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self.store is not None:
            self.store.close()
            self.store.arena.close()

    async def _sweep_leases(self) -> None:
        while True:
            await asyncio.sleep(LEASE_SWEEP_INTERVAL_S)
            expired = self.store.expire_leases()
            if expired:
                metrics.EXPIRED_LEASES.inc(expired)
                log.info("leases_expired", count=expired, quarantined_bytes=self.store.quarantined_bytes)
            freed = self.store.release_quarantine()
            if freed:
                log.info("quarantine_released", leases=freed, reason="writer_gone")
