"""The engines' client of the kvstore: match, fetch and put that never fail the caller.

The kvstore is a cache, so every failure (dead or slow store, expired lease, restart, bad answer)
turns into a miss: `match` returns MatchResult(0, 0), `fetch` a FetchResult with num_tokens == 0,
`put` None. Calls carry a deadline; the channel reconnects by itself (backoff capped at
MAX_RECONNECT_BACKOFF_MS) when the store comes back, possibly with a new arena, which is re-mapped.

KV travels as uint8 matrices whose row i is one block's payload (salon/engine/kv/kv_transfer.py
defines the bytes). With use_shared_memory=True (engine on the kvstore's host) fetched rows are
copied straight out of the shared arena and put rows written straight into it; gRPC carries only
offsets and a lease. The arena is mapped ahead of time, off the event loop (`start`, and again in the
background when a reply names a new arena after a kvstore restart); until it is mapped, or if it
cannot be (another host, or a file that fails arena_mapping's checks), KV moves over gRPC.

A shared-memory put checks its lease's remaining time before it writes, writes in a worker thread,
and sends a checksum of every slot with the commit: the kvstore links nothing a slot does not hold.
A write may still run after its lease expired (a stalled process or thread), so the kvstore keeps an
expired lease's space out of use until this writer is provably done with it: the mapping holds a
writer lock while it can write (writer_lock.py), every lease ends with a commit or a release sent
after its write is over (also when the caller was cancelled meanwhile: the release follows the
worker thread), and each prepare reports the generation below which none of this writer's writes
is running or can start (_WriterProgress). Puts and drops carry a NamespaceClaim when the engine
has one (the gateway's grant for the tenant, salon/common/namespace_grant.py).

    client = KVStoreClient("127.0.0.1:50061", use_shared_memory=True)
    hit = await client.match(namespace, token_ids, layout)           # MatchResult
    kv = await client.fetch(namespace, token_ids, layout, max_tokens=hit.usable_tokens)
    kv.global_kv[i - kv.first_global_block]                          # block i's global payload
    kv.local_kv[i - kv.local_from_block]                             # block i's local payload (window)
    await client.put(namespace, token_ids, layout, global_kv, local_kv, local_first_block=..., conversation_id=...)
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import numpy as np
from opentelemetry.instrumentation.grpc import aio_client_interceptors

from salon.api.kvstore.v1 import kvstore_pb2 as pb
from salon.api.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from salon.common.client_tls import ClientTLS, client_credentials, tls_options
from salon.common.kvstore_contract.arena_mapping import ArenaMapping, ArenaRefused
from salon.common.kvstore_contract.layout import MISS, KVLayout, MatchResult
from salon.common.logging import get_logger
from salon.common.message_limits import grpc_options
from salon.common.prefix_hash import encode_token_ids

log = get_logger(__name__)

MAX_RECONNECT_BACKOFF_MS = 1000
# A shared-memory read or write counts only if it ended this long before the lease's end.
LEASE_MARGIN_S = 1.0
PUT_CHUNK_BYTES = 4 << 20
INLINE_WRITE_BYTES = 1 << 20
_MAP_RETRY_MAX_S = 5.0
# How often a shared-memory client asks which arena the kvstore has (a restart makes a new one).
ARENA_CHECK_INTERVAL_S = 2.0


class _ArenaChanged(Exception):
    """A shared-memory reply names an arena this client has not mapped (the kvstore restarted)."""


class _WriterProgress:
    """Which of one writer's put leases may still be written: the ones granted whose write is not
    over, and any lease a prepare still in flight may get (its generation will be above every
    generation granted before it was sent). `done_below` is the lowest such generation."""

    def __init__(self) -> None:
        self.max_granted = 0
        self._asking: dict[int, int] = {}  # prepare in flight -> max_granted when it was sent
        self._writing: dict[int, int] = {}  # generation -> leases of it still being written (1)
        self._next_ask = 0

    def asking(self) -> int:
        self._next_ask += 1
        self._asking[self._next_ask] = self.max_granted
        return self._next_ask

    def granted(self, ask: int, generation: int) -> None:
        del self._asking[ask]
        self.max_granted = max(self.max_granted, generation)
        self._writing[generation] = self._writing.get(generation, 0) + 1

    def refused(self, ask: int) -> None:
        self._asking.pop(ask, None)

    def done(self, generation: int) -> None:
        left = self._writing[generation] - 1
        if left:
            self._writing[generation] = left
        else:
            del self._writing[generation]

    def done_below(self) -> int:
        return min([*self._writing, *(m + 1 for m in self._asking.values()), self.max_granted + 1])


@dataclass(frozen=True)
class NamespaceClaim:
    """Which tenant a namespace belongs to and a gateway's grant for it (see NamespaceClaim in the proto)."""

    tenant_salt: str
    model_id: str
    layout_tag: str
    grant: bytes

    def to_proto(self) -> pb.NamespaceClaim:
        return pb.NamespaceClaim(
            tenant_salt=self.tenant_salt, model_id=self.model_id, layout_tag=self.layout_tag, grant=self.grant
        )


@dataclass(frozen=True)
class FetchResult:
    """KV of a usable prefix of num_tokens tokens (0: a miss).

    global_kv row j is block first_global_block + j (blocks first_global_block .. num_blocks - 1);
    local_kv row j is block local_from_block + j (the window before num_tokens).
    """

    num_tokens: int
    first_global_block: int
    global_kv: np.ndarray  # uint8 [num_blocks - first_global_block, global_bytes_per_block]
    local_from_block: int
    local_kv: np.ndarray  # uint8 [num_blocks - local_from_block, local_bytes_per_block]
    transport: str  # "grpc" | "shared_memory" | "none"

    def blocks(self) -> list[tuple[np.ndarray | None, np.ndarray | None]]:
        """Per block of the prefix: (global payload or None if not sent, local payload or None)."""
        out = []
        for i in range(self.first_global_block + len(self.global_kv) if self.num_tokens else 0):
            g = self.global_kv[i - self.first_global_block] if i >= self.first_global_block else None
            loc = self.local_kv[i - self.local_from_block] if i >= self.local_from_block else None
            out.append((g, loc))
        return out


@dataclass(frozen=True)
class PutResult:
    stored_blocks: int
    existing_blocks: int
    evicted_blocks: int
    skipped_blocks: int


def _put_result(counts: pb.PutCounts) -> PutResult:
    return PutResult(counts.stored_blocks, counts.existing_blocks, counts.evicted_blocks, counts.skipped_blocks)


def _empty_fetch(layout: KVLayout) -> FetchResult:
    return FetchResult(
        0,
        0,
        np.empty((0, layout.global_bytes_per_block), np.uint8),
        0,
        np.empty((0, layout.local_bytes_per_block), np.uint8),
        "none",
    )


def layout_to_proto(layout: KVLayout) -> pb.KVLayout:
    return pb.KVLayout(
        block_size_tokens=layout.block_size_tokens,
        global_bytes_per_block=layout.global_bytes_per_block,
        local_bytes_per_block=layout.local_bytes_per_block,
        sliding_window_tokens=layout.sliding_window_tokens,
    )


def _token_bytes(token_ids: Sequence[int] | bytes) -> bytes:
    return bytes(token_ids) if isinstance(token_ids, (bytes, bytearray, memoryview)) else encode_token_ids(token_ids)


class KVStoreClient:
    def __init__(
        self,
        target: str,
        use_shared_memory: bool = False,
        timeout_s: float = 2.0,
        tls: ClientTLS | None = None,
        arena_dir: str = "/dev/shm/salon-kvstore",
        arena_owner_uid: int | None = None,
    ) -> None:
        self.target = target
        self.tls = tls
        self.use_shared_memory = use_shared_memory
        self.timeout_s = timeout_s
        # Where the kvstore's arena must be, and whose (arena_mapping.py); None: this process's uid.
        self.arena_dir = arena_dir
        self.arena_owner_uid = arena_owner_uid
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.KVStoreServiceStub | None = None
        self._arena: ArenaMapping | None = None
        self._progress = _WriterProgress()  # of the mapped arena's writer lock
        self._mapping: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None
        self._refused_arenas: set[str] = set()
        self._healthy = True
        self._background: set[asyncio.Task] = set()

    def start(self) -> None:
        """Map the kvstore's arena ahead of the first transfer, off the event loop, and again whenever
        the kvstore restarts with a new one (checked every ARENA_CHECK_INTERVAL_S; shared memory only).
        Transfers use gRPC until it is mapped."""
        if self.use_shared_memory and self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_arena(), name="kvstore-arena-watch")

    async def _watch_arena(self) -> None:
        while True:
            stats = await self.stats()
            if stats is not None and stats.shm_name:
                self._map_later(stats.shm_name)
            await asyncio.sleep(ARENA_CHECK_INTERVAL_S)

    async def map_arena(self) -> bool:
        """Map the arena now and wait for it (tests and benches); True if shared memory is usable."""
        if self.use_shared_memory:
            self._map_later(None)
            if self._mapping is not None:
                await asyncio.shield(self._mapping)
        return self._arena is not None

    @property
    def arena_mapped(self) -> bool:
        return self._arena is not None

    # ---- public API ----------------------------------------------------------------------------

    async def match(
        self, namespace: bytes, token_ids: Sequence[int] | bytes, layout: KVLayout, timeout_s: float | None = None
    ) -> MatchResult:
        request = pb.MatchRequest(
            namespace=namespace, token_ids_le32=_token_bytes(token_ids), layout=layout_to_proto(layout)
        )
        try:
            response = await self._get_stub().Match(request, timeout=timeout_s or self.timeout_s)
        except (TimeoutError, grpc.aio.AioRpcError, OSError) as exc:
            self._failed("match", exc)
            return MISS
        self._ok()
        return MatchResult(response.matched_tokens, response.usable_tokens)

    async def fetch(
        self,
        namespace: bytes,
        token_ids: Sequence[int] | bytes,
        layout: KVLayout,
        max_tokens: int = 0,
        from_block: int = 0,
        timeout_s: float | None = None,
        out_global: np.ndarray | None = None,
        out_local: np.ndarray | None = None,
    ) -> FetchResult:
        """KV of the longest usable prefix of at most max_tokens tokens (0: no limit); global KV only
        for blocks >= from_block. Never raises: a failure is a miss.

        out_global / out_local: optional uint8 [rows, bytes_per_block] buffers the engine reuses; the
        result's arrays are then views of their first rows (fresh memory costs page faults that
        dominate a large fetch). Buffers too small are ignored."""
        shm = self.use_shared_memory and self._arena is not None
        request = pb.FetchRequest(
            namespace=namespace,
            token_ids_le32=_token_bytes(token_ids),
            max_tokens=max_tokens,
            layout=layout_to_proto(layout),
            transport=pb.TRANSPORT_SHARED_MEMORY if shm else pb.TRANSPORT_GRPC,
            from_block_index=from_block,
        )
        started = time.monotonic()
        deadline = started + (timeout_s or self.timeout_s)
        out = (out_global, out_local)
        try:
            try:
                call = self._get_stub().Fetch(request, timeout=timeout_s or self.timeout_s)
                result = await (
                    self._read_shm(call, layout, from_block, started, out)
                    if shm
                    else self._read_grpc(call, layout, from_block, out)
                )
            except _ArenaChanged:  # mapped in the background; this once, the bytes come over gRPC
                request.transport = pb.TRANSPORT_GRPC
                call = self._get_stub().Fetch(request, timeout=max(0.001, deadline - time.monotonic()))
                result = await self._read_grpc(call, layout, from_block, out)
        except (TimeoutError, grpc.aio.AioRpcError, OSError, ValueError) as exc:
            self._failed("fetch", exc)
            return _empty_fetch(layout)
        self._ok()
        return result

    async def put(
        self,
        namespace: bytes,
        token_ids: Sequence[int] | bytes,
        layout: KVLayout,
        global_kv: np.ndarray,
        local_kv: np.ndarray | None = None,
        *,
        first_block: int = 0,
        local_first_block: int = 0,
        conversation_id: str = "",
        claim: NamespaceClaim | None = None,
        timeout_s: float | None = None,
    ) -> PutResult | None:
        """Store blocks first_block .. first_block + len(global_kv) - 1 of a context (global_kv row j
        = block first_block + j) and local KV for blocks local_first_block .. (local_kv row j), which
        must lie within those blocks (ValueError otherwise: a caller bug). Blocks before first_block
        must be stored already, else nothing from there on is stored. Idempotent. Returns None if
        the store could not be reached."""
        token_bytes = _token_bytes(token_ids)
        global_kv = np.ascontiguousarray(global_kv, dtype=np.uint8).reshape(-1, layout.global_bytes_per_block)
        if local_kv is None or len(local_kv) == 0:
            local_kv = np.empty((0, max(layout.local_bytes_per_block, 1)), np.uint8)
        else:
            local_kv = np.ascontiguousarray(local_kv, dtype=np.uint8).reshape(-1, layout.local_bytes_per_block)
        num_blocks = first_block + len(global_kv)
        if num_blocks * layout.block_size_tokens * 4 > len(token_bytes):
            raise ValueError(f"global_kv holds blocks up to {num_blocks}, more than the token ids cover")
        if len(local_kv) and not first_block <= local_first_block <= num_blocks - len(local_kv):
            raise ValueError("local_kv rows must be blocks within first_block .. first_block + len(global_kv) - 1")
        header = pb.PutHeader(
            namespace=namespace,
            token_ids_le32=token_bytes,
            layout=layout_to_proto(layout),
            conversation_id=conversation_id,
            claim=claim.to_proto() if claim else None,
        )
        try:
            if self.use_shared_memory and self._arena is not None:
                result = await self._put_shm(
                    header, layout, global_kv, local_kv, first_block, local_first_block, timeout_s or self.timeout_s
                )
                if result is not None:
                    self._ok()
                    return result
            requests = _put_requests(header, layout, global_kv, local_kv, first_block, local_first_block)
            response = await self._get_stub().Put(requests, timeout=timeout_s or self.timeout_s)
        except (TimeoutError, grpc.aio.AioRpcError, OSError) as exc:
            self._failed("put", exc)
            return None
        self._ok()
        return _put_result(response.counts)

    async def stats(self, timeout_s: float | None = None) -> pb.GetStatsResponse | None:
        try:
            return await self._get_stub().GetStats(pb.GetStatsRequest(), timeout=timeout_s or self.timeout_s)
        except (TimeoutError, grpc.aio.AioRpcError, OSError) as exc:
            self._failed("stats", exc)
            return None

    async def drop(
        self,
        namespace: bytes,
        conversation_id: str = "",
        claim: NamespaceClaim | None = None,
        timeout_s: float | None = None,
    ) -> int | None:
        """Remove a conversation's blocks (or the whole namespace); blocks removed, None on failure."""
        try:
            response = await self._get_stub().Drop(
                pb.DropRequest(
                    namespace=namespace, conversation_id=conversation_id, claim=claim.to_proto() if claim else None
                ),
                timeout=timeout_s or self.timeout_s,
            )
        except (TimeoutError, grpc.aio.AioRpcError, OSError) as exc:
            self._failed("drop", exc)
            return None
        return response.dropped_blocks

    async def close(self) -> None:
        for task in (self._mapping, self._watch):
            if task is not None and not task.done():
                task.cancel()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    # ---- transports ----------------------------------------------------------------------------

    async def _read_grpc(self, call, layout: KVLayout, from_block: int, out) -> FetchResult:
        header = global_kv = local_kv = None
        first_global = 0
        gb, lb = layout.global_bytes_per_block, max(layout.local_bytes_per_block, 1)
        async for message in call:
            if header is None:
                header = message.header
                num_blocks = header.num_tokens // layout.block_size_tokens
                first_global = min(from_block, num_blocks)
                global_kv = _rows(out[0], num_blocks - first_global, gb)
                local_kv = _rows(out[1], num_blocks - header.local_from_block_index, lb)
                g_rows = l_rows = 0
                continue
            chunk = message.chunk  # rows are written straight into the result: no join, no extra copy
            g = np.frombuffer(chunk.global_kv, np.uint8).reshape(-1, gb)
            j = chunk.first_global_block_index - first_global
            global_kv[j : j + len(g)] = g
            g_rows += len(g)
            if chunk.local_kv:
                loc = np.frombuffer(chunk.local_kv, np.uint8).reshape(-1, lb)
                j = chunk.first_local_block_index - header.local_from_block_index
                local_kv[j : j + len(loc)] = loc
                l_rows += len(loc)
        if header is None:
            raise ValueError("Fetch stream without a header")
        if g_rows != len(global_kv) or l_rows != len(local_kv):
            raise ValueError("Fetch stream ended early")
        return FetchResult(header.num_tokens, first_global, global_kv, header.local_from_block_index, local_kv, "grpc")

    async def _read_shm(self, call, layout: KVLayout, from_block: int, started: float, out) -> FetchResult:
        header = None
        async for message in call:
            header = message.header
        if header is None:
            raise ValueError("Fetch stream without a header")
        if not header.num_tokens:
            return _empty_fetch(layout)
        arena = self._arena
        if arena is None or arena.name != header.shm_name:  # the kvstore restarted with a new arena
            self._release_later(header.lease_id)
            self._map_later(header.shm_name)
            raise _ArenaChanged(header.shm_name)
        num_blocks = header.num_tokens // layout.block_size_tokens
        first_global = min(from_block, num_blocks)
        gb, lb = layout.global_bytes_per_block, layout.local_bytes_per_block
        global_kv = _rows(out[0], len(header.global_offsets), gb)
        _gather(arena.array, header.global_offsets, global_kv)
        local_kv = _rows(out[1], len(header.local_offsets), max(lb, 1))
        if lb:
            _gather(arena.array, header.local_offsets, local_kv)
        self._release_later(header.lease_id)
        if time.monotonic() - started > header.lease_ttl_ms / 1000 - LEASE_MARGIN_S:
            raise ValueError("shared-memory read outlived its lease")  # the bytes may have been reused
        return FetchResult(
            header.num_tokens, first_global, global_kv, header.local_from_block_index, local_kv, "shared_memory"
        )

    async def _put_shm(self, header, layout, global_kv, local_kv, first_block, local_first_block, timeout_s):
        """Prepare, write into the arena, commit. None means: use gRPC instead (arena not mapped)."""
        started = time.monotonic()
        arena, progress = self._arena, self._progress
        if arena is None:
            return None
        request = pb.PrepareSharedPutRequest(
            header=header,
            num_blocks=first_block + len(global_kv),
            local_block_indices=range(local_first_block, local_first_block + len(local_kv)),
            first_block_index=first_block,
            writer_id=arena.writer_id,
        )
        stub = self._get_stub()
        ask = progress.asking()
        request.writes_done_below_generation = progress.done_below()
        try:
            prepared = await stub.PrepareSharedPut(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            progress.refused(ask)  # no lease this writer knows of: nothing of it is written
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:  # our writer lock is on another arena
                self._map_later(None)  # (the kvstore restarted): map its new one, use gRPC meanwhile
                return None
            raise
        except BaseException:
            progress.refused(ask)
            raise
        progress.granted(ask, prepared.generation)
        lease = _WriteLease(self, progress, prepared.generation, prepared.lease_id)
        try:
            release = pb.ReleaseLeaseRequest(lease_id=prepared.lease_id)
            if arena.name != prepared.shm_name:
                lease.write_over()
                await stub.ReleaseLease(release, timeout=timeout_s)
                lease.ended = True
                self._map_later(prepared.shm_name)
                return None
            lease_end = started + prepared.lease_ttl_ms / 1000
            # Never start a write that might end after the lease: the space would be another put's by then.
            if time.monotonic() > lease_end - LEASE_MARGIN_S:
                lease.write_over()
                await stub.ReleaseLease(release, timeout=timeout_s)
                lease.ended = True
                raise TimeoutError("shared-memory put lease too close to its end to write")
            slots = prepared.slots
            g_slots = [s for s in slots if s.write_global]
            l_slots = [s for s in slots if s.write_local]
            g_rows = [s.block_index - first_block for s in g_slots]
            l_rows = [s.block_index - local_first_block for s in l_slots]
            write = (
                _write_and_checksum,
                arena.array,
                global_kv,
                g_rows,
                [s.global_offset for s in g_slots],
                local_kv,
                l_rows,
                [s.local_offset for s in l_slots],
            )
            num_bytes = len(g_rows) * global_kv.shape[1] + len(l_rows) * local_kv.shape[1]
            # Small puts are written inline (a thread hop costs more); large ones off the event loop. A
            # cancelled caller leaves the thread running: the lease ends when the thread does.
            if num_bytes > INLINE_WRITE_BYTES:
                lease.thread = asyncio.get_running_loop().run_in_executor(None, *write)
                g_crc, l_crc = await asyncio.shield(lease.thread)
            else:
                g_crc, l_crc = write[0](*write[1:])
            lease.write_over()
            if time.monotonic() > lease_end - LEASE_MARGIN_S:
                await stub.ReleaseLease(release, timeout=timeout_s)
                lease.ended = True
                raise TimeoutError("shared-memory put outlived its lease")
            response = await stub.CommitSharedPut(
                pb.CommitSharedPutRequest(lease_id=prepared.lease_id, global_crc32=g_crc, local_crc32=l_crc),
                timeout=timeout_s,
            )
            lease.ended = True
            return _put_result(response.counts)
        finally:
            lease.settle()

    # ---- plumbing ------------------------------------------------------------------------------

    def _get_stub(self) -> pb_grpc.KVStoreServiceStub:
        if self._stub is None:
            options = [
                *grpc_options(),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
                *tls_options(self.tls),
            ]
            # Trace unary calls only: the tracing interceptors of streaming calls re-serialize every
            # message to record its size, which costs more than the transfer itself for KV streams.
            interceptors = [i for i in aio_client_interceptors() if isinstance(i, grpc.aio.UnaryUnaryClientInterceptor)]
            if self.tls is None:
                self._channel = grpc.aio.insecure_channel(self.target, options=options, interceptors=interceptors)
            else:
                self._channel = grpc.aio.secure_channel(
                    self.target, client_credentials(self.tls), options=options, interceptors=interceptors
                )
            self._stub = pb_grpc.KVStoreServiceStub(self._channel)
        return self._stub

    def _map_later(self, name: str | None) -> None:
        """Map arena `name` (None: ask the kvstore which) in the background, unless already under way."""
        if self._mapping is not None and not self._mapping.done():
            return
        if name is not None and (name in self._refused_arenas or (self._arena and self._arena.name == name)):
            return
        self._mapping = asyncio.get_running_loop().create_task(self._map(name), name="kvstore-arena-map")

    async def _map(self, name: str | None) -> None:
        delay_s = 0.1
        while name is None:
            stats = await self.stats()
            if stats is not None:
                name = stats.shm_name
                break
            await asyncio.sleep(delay_s)
            delay_s = min(_MAP_RETRY_MAX_S, delay_s * 2)
        if not name or name in self._refused_arenas or (self._arena is not None and self._arena.name == name):
            return
        try:
            mapping = await asyncio.to_thread(ArenaMapping, name, self.arena_dir, self.arena_owner_uid)
        except ArenaRefused as exc:
            self._refused_arenas.add(name)
            log.warning("kvstore_arena_refused", arena=name, error=str(exc), fallback="grpc")
            return
        except OSError as exc:  # another host: nothing to map
            self._refused_arenas.add(name)
            log.warning("kvstore_arena_unmappable", arena=name, error=str(exc), fallback="grpc")
            return
        old, self._arena = self._arena, mapping
        self._progress = _WriterProgress()
        if old is not None:
            old.close()
        log.info("kvstore_arena_mapped", arena=name)

    def _release_later(self, lease_id: str) -> None:
        async def release() -> None:
            try:
                await self._get_stub().ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease_id), timeout=self.timeout_s)
            except (TimeoutError, grpc.aio.AioRpcError, OSError):
                pass  # the lease ends by itself

        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _failed(self, what: str, exc: BaseException) -> None:
        if self._healthy:
            log.warning("kvstore_unavailable", call=what, error=_describe(exc))
        self._healthy = False

    def _ok(self) -> None:
        if not self._healthy:
            log.info("kvstore_available")
        self._healthy = True


class _WriteLease:
    """One shared-memory put lease on the client's side: its write is over once (write_over), and the
    kvstore hears that the lease ended (a commit or a release) only after that."""

    def __init__(self, client: KVStoreClient, progress: _WriterProgress, generation: int, lease_id: str) -> None:
        self._client = client
        self._progress = progress
        self._generation = generation
        self._lease_id = lease_id
        self._writing = True
        self.thread: asyncio.Future | None = None  # the worker thread writing, if any
        self.ended = False  # the kvstore answered a commit or a release of it

    def write_over(self) -> None:
        if self._writing:
            self._writing = False
            self._progress.done(self._generation)

    def settle(self) -> None:
        """The put is over on the caller's side (done, failed or cancelled): once nothing writes under
        the lease any more, make sure the kvstore hears that it ended."""
        if self.thread is not None and not self.thread.done():
            self.thread.add_done_callback(lambda _: self._after_write())
        else:
            self._after_write()

    def _after_write(self) -> None:
        self.write_over()
        if not self.ended:
            self.ended = True
            self._client._release_later(self._lease_id)


def _rows(buffer: np.ndarray | None, num_rows: int, row_bytes: int) -> np.ndarray:
    """The first num_rows rows of `buffer` if it fits, else a new uint8 [num_rows, row_bytes] array."""
    if (
        buffer is not None
        and buffer.dtype == np.uint8
        and buffer.ndim == 2
        and buffer.shape[0] >= num_rows
        and buffer.shape[1] == row_bytes
        and buffer.flags.c_contiguous
    ):
        return buffer[:num_rows]
    return np.empty((num_rows, row_bytes), np.uint8)


def _runs(offsets: Sequence[int], row_bytes: int, rows: Sequence[int] | None = None) -> list[tuple[int, int, int]]:
    """(first index, end index, arena offset) of maximal runs where consecutive entries lie back to
    back in the arena (and, when rows are given, are consecutive rows): blocks stored by one put
    are usually contiguous, so a fetch is a few large copies instead of one per block."""
    n = len(offsets)
    if n == 0:
        return []
    offs = np.asarray(offsets, dtype=np.int64)
    contiguous = np.diff(offs) == row_bytes
    if rows is not None:
        contiguous &= np.diff(np.asarray(rows, dtype=np.int64)) == 1
    breaks = np.flatnonzero(~contiguous) + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), n]
    return [(a, b, int(offs[a])) for a, b in zip(starts, ends)]


def _gather(arena: np.ndarray, offsets: Sequence[int], out: np.ndarray) -> None:
    """out[j] = arena[offsets[j] : offsets[j] + row_bytes] for every j."""
    row_bytes = out.shape[1]
    for a, b, offset in _runs(offsets, row_bytes):
        out[a:b] = arena[offset : offset + (b - a) * row_bytes].reshape(b - a, row_bytes)


def _write_and_checksum(
    arena: np.ndarray,
    global_kv: np.ndarray,
    g_rows: list[int],
    g_offsets: list[int],
    local_kv: np.ndarray,
    l_rows: list[int],
    l_offsets: list[int],
) -> tuple[list[int], list[int]]:
    """Write the put's rows into their slots and return each slot's CRC-32 (worker thread: both release
    the GIL). The checksums are of the rows meant for each slot, which the kvstore compares with what
    the slots hold."""
    _scatter(global_kv, g_rows, g_offsets, arena)
    _scatter(local_kv, l_rows, l_offsets, arena)
    return [zlib.crc32(global_kv[r]) for r in g_rows], [zlib.crc32(local_kv[r]) for r in l_rows]


def _scatter(rows: np.ndarray, row_indices: Sequence[int], offsets: Sequence[int], arena: np.ndarray) -> None:
    """arena[offsets[j] : offsets[j] + row_bytes] = rows[row_indices[j]] for every j."""
    if not row_indices:
        return
    row_bytes = rows.shape[1]
    for a, b, offset in _runs(offsets, row_bytes, row_indices):
        r = row_indices[a]
        arena[offset : offset + (b - a) * row_bytes] = rows[r : r + (b - a)].reshape(-1)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


async def _put_requests(header, layout: KVLayout, global_kv, local_kv, first_block: int, local_first_block: int):
    """Header, then chunks of about PUT_CHUNK_BYTES; each chunk's local rows lie within its global rows."""
    yield pb.PutRequest(header=header)
    gb, lb = layout.global_bytes_per_block, layout.local_bytes_per_block
    step = max(1, PUT_CHUNK_BYTES // (gb + lb))
    local_end = local_first_block + len(local_kv)
    for s in range(first_block, first_block + len(global_kv), step):
        e = min(s + step, first_block + len(global_kv))
        l0, l1 = max(s, local_first_block), min(e, local_end)
        chunk = pb.KVChunk(
            first_global_block_index=s,
            global_kv=global_kv[s - first_block : e - first_block].tobytes(),
            first_local_block_index=l0 if l1 > l0 else s,
            local_kv=local_kv[l0 - local_first_block : l1 - local_first_block].tobytes() if l1 > l0 else b"",
        )
        yield pb.PutRequest(chunk=chunk)
