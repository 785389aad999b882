"""The KVStoreService gRPC servicer: protobuf <-> domain at the edge, validation, metrics.

Each handler does its tree work in one synchronous step (no await inside a store call), so the
tree is never seen half-changed. A Fetch over gRPC holds its pins across the stream's awaits and
drops them in `finally` (also when the client goes away).

Who may do what: the bootstrap lets only engine identities call (salon/common/peer_identity.py);
here, with a namespace grant key, Put / PrepareSharedPut / Drop also need a NamespaceClaim that a
gateway's grant backs (salon/common/namespace_grant.py), and each caller (its identity, or its
address without TLS) holds at most max_leases_per_peer leases.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from salon.api.kvstore.v1 import kvstore_pb2 as pb
from salon.api.kvstore.v1 import kvstore_pb2_grpc as pb_grpc
from salon.common import namespace_grant
from salon.common.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, ResourceExhausted
from salon.common.kvstore_contract.layout import KVLayout
from salon.common.peer_identity import peer_key
from salon.common.prefix_hash import namespace_digest
from salon.kvstore import metrics
from salon.kvstore.radix_tree import LayoutMismatch
from salon.kvstore.store import KVStore, LeaseLimit, PutCounts, UnknownWriter, unwritten_slot

MAX_NAMESPACE_BYTES = 64
INLINE_CHECK_BYTES = 1 << 20
GRPC = "grpc"
SHM = "shared_memory"


def layout_from_proto(msg: pb.KVLayout, field: str = "layout") -> KVLayout:
    layout = KVLayout(
        block_size_tokens=msg.block_size_tokens,
        global_bytes_per_block=msg.global_bytes_per_block,
        local_bytes_per_block=msg.local_bytes_per_block,
        sliding_window_tokens=msg.sliding_window_tokens,
    )
    problems = layout.problems()
    if problems:
        raise InvalidArgument("; ".join(p.replace("layout.", f"{field}.", 1) for p in problems))
    return layout


def check_namespace(namespace: bytes) -> bytes:
    if not 0 < len(namespace) <= MAX_NAMESPACE_BYTES:
        raise InvalidArgument(f"namespace must be 1..{MAX_NAMESPACE_BYTES} bytes, got {len(namespace)}")
    return namespace


def check_tokens(token_bytes: bytes, field: str = "token_ids_le32") -> bytes:
    if len(token_bytes) % 4:
        raise InvalidArgument(f"{field} must hold 4 bytes per token id, got {len(token_bytes)} bytes")
    return token_bytes


def counts_to_proto(counts: PutCounts) -> pb.PutCounts:
    return pb.PutCounts(
        stored_blocks=counts.stored_blocks,
        existing_blocks=counts.existing_blocks,
        evicted_blocks=counts.evicted_blocks,
        skipped_blocks=counts.skipped_blocks,
    )


def check_claim(
    namespace: bytes, claim: pb.NamespaceClaim, grant_key: bytes | None, field: str, now_unix_s: float
) -> None:
    """PermissionDenied unless a gateway's grant backs `claim` and the claim names `namespace`
    (nothing is checked without a grant key)."""
    if grant_key is None:
        return
    if not claim.grant:
        raise PermissionDenied(f"{field}: required (this kvstore accepts only namespaces a gateway granted)")
    problem = namespace_grant.verify(grant_key, claim.tenant_salt, claim.grant, now_unix_s)
    if problem is not None:
        raise PermissionDenied(f"{field}.grant: {problem}")
    if namespace_digest(claim.model_id, claim.layout_tag, claim.tenant_salt) != namespace:
        raise PermissionDenied(f"{field}: the claimed tenant, model and layout do not make this namespace")


class KVStoreServicer(pb_grpc.KVStoreServiceServicer):
    def __init__(
        self, store: KVStore, started_at_unix_ms: int, fetch_chunk_bytes: int, grant_key: bytes | None = None
    ) -> None:
        self._store = store
        self._started_at_unix_ms = started_at_unix_ms
        self._fetch_chunk_bytes = fetch_chunk_bytes
        self._grant_key = grant_key
        self._evicted_seen = (0, 0)

    # ---- Match / Fetch -------------------------------------------------------------------------

    async def Match(self, request: pb.MatchRequest, context: grpc.aio.ServicerContext) -> pb.MatchResponse:
        namespace = check_namespace(request.namespace)
        layout = layout_from_proto(request.layout)
        token_bytes = check_tokens(request.token_ids_le32)
        try:
            result = self._store.match(namespace, layout, token_bytes)
        except LayoutMismatch as exc:
            raise InvalidArgument(str(exc)) from None
        num_tokens = len(token_bytes) // 4
        metrics.QUERY_TOKENS.inc(num_tokens)
        metrics.MATCHED_TOKENS.inc(result.matched_tokens)
        metrics.HIT_TOKENS.inc(result.usable_tokens)
        metrics.MISS_TOKENS.inc(num_tokens - result.usable_tokens)
        return pb.MatchResponse(matched_tokens=result.matched_tokens, usable_tokens=result.usable_tokens)

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FetchResponse]:
        namespace = check_namespace(request.namespace)
        layout = layout_from_proto(request.layout)
        token_bytes = check_tokens(request.token_ids_le32)
        if request.transport not in (pb.TRANSPORT_UNSPECIFIED, pb.TRANSPORT_GRPC, pb.TRANSPORT_SHARED_MEMORY):
            raise InvalidArgument(f"transport: unknown value {request.transport}")
        store = self._store
        try:
            plan = store.begin_fetch(namespace, layout, token_bytes, request.max_tokens)
        except LayoutMismatch as exc:
            raise InvalidArgument(str(exc)) from None
        first_global = min(request.from_block_index, len(plan.nodes))
        header = pb.FetchHeader(num_tokens=plan.num_tokens, local_from_block_index=plan.local_from_block)
        if request.transport == pb.TRANSPORT_SHARED_MEMORY and plan.nodes:
            peer = peer_key(context)
            try:
                store.check_lease_room(peer)
            except LeaseLimit as exc:
                store.end_fetch(plan)
                raise ResourceExhausted(str(exc), retry_after_ms=int(store.lease_ttl_s * 1000)) from None
            header.shm_name = store.arena.name
            header.lease_id = store.lease_fetch(plan, peer)
            header.lease_ttl_ms = int(store.lease_ttl_s * 1000)
            header.global_offsets.extend([n.global_span[0] for n in plan.nodes[first_global:]])
            header.local_offsets.extend([n.local_span[0] for n in plan.nodes[plan.local_from_block :]])
            metrics.FETCH_BYTES.labels(SHM).inc(_plan_bytes(plan, first_global, layout))
            yield pb.FetchResponse(header=header)
            return
        try:
            yield pb.FetchResponse(header=header)
            for chunk in self._chunks(plan, first_global, layout):
                metrics.FETCH_BYTES.labels(GRPC).inc(len(chunk.global_kv) + len(chunk.local_kv))
                yield pb.FetchResponse(chunk=chunk)
        finally:
            store.end_fetch(plan)

    def _chunks(self, plan, first_global: int, layout: KVLayout):
        """Consecutive blocks' bytes, about fetch_chunk_bytes per message (copied out of the arena)."""
        nodes, local_from = plan.nodes, plan.local_from_block
        start = min(first_global, local_from)
        per_block = layout.global_bytes_per_block + layout.local_bytes_per_block
        step = max(1, self._fetch_chunk_bytes // per_block)
        read = self._store.arena.read
        for s in range(start, len(nodes), step):
            e = min(s + step, len(nodes))
            g0, l0 = max(s, first_global), max(s, local_from)
            yield pb.KVChunk(
                first_global_block_index=g0,
                global_kv=b"".join([read(n.global_extent) for n in nodes[g0:e]]),
                first_local_block_index=l0,
                local_kv=b"".join([read(n.local_extent) for n in nodes[l0:e]]),
            )

    # ---- Put -----------------------------------------------------------------------------------

    async def Put(
        self, request_iterator: AsyncIterator[pb.PutRequest], context: grpc.aio.ServicerContext
    ) -> pb.PutResponse:
        session = None
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("item")
                if kind == "header":
                    if session is not None:
                        raise InvalidArgument("header: a Put stream has exactly one header, first")
                    session = self._begin_put(message.header, context)
                elif kind == "chunk":
                    if session is None:
                        raise InvalidArgument("chunk: the first message of a Put stream must be the header")
                    self._put_chunk(session, message.chunk)
                else:
                    raise InvalidArgument("item: each PutRequest carries a header or a chunk")
            if session is None:
                raise InvalidArgument("header: missing (empty Put stream)")
        finally:
            counts = session.close() if session is not None else None
            self._sync_evictions()
        return pb.PutResponse(counts=counts_to_proto(counts))

    def _begin_put(self, header: pb.PutHeader, context):
        namespace = check_namespace(header.namespace)
        layout = layout_from_proto(header.layout, "header.layout")
        token_bytes = check_tokens(header.token_ids_le32, "header.token_ids_le32")
        check_claim(namespace, header.claim, self._grant_key, "header.claim", time.time())
        try:
            return self._store.begin_put(namespace, layout, token_bytes, header.conversation_id)
        except LayoutMismatch as exc:
            raise InvalidArgument(str(exc)) from None

    def _put_chunk(self, session, chunk: pb.KVChunk) -> None:
        layout = session.layout
        gb, lb = layout.global_bytes_per_block, layout.local_bytes_per_block
        bad_local = len(chunk.local_kv) % lb if lb else len(chunk.local_kv)
        if len(chunk.global_kv) % gb or bad_local:
            raise InvalidArgument(
                f"chunk: global_kv ({len(chunk.global_kv)} B) and local_kv ({len(chunk.local_kv)} B) must be whole "
                f"blocks of {gb} and {lb} bytes"
            )
        g0, ng = chunk.first_global_block_index, len(chunk.global_kv) // gb
        l0, nl = chunk.first_local_block_index, (len(chunk.local_kv) // lb if lb else 0)
        if g0 + ng > session.num_blocks:
            raise InvalidArgument(
                f"chunk: blocks up to {g0 + ng} exceed the header's {session.num_blocks} whole blocks"
            )
        if g0 < session.next_block_index and ng:
            raise InvalidArgument(
                f"chunk.first_global_block_index: {g0} is below {session.next_block_index} (ascending)"
            )
        if nl and not (g0 <= l0 and l0 + nl <= g0 + ng):
            raise InvalidArgument("chunk: local_kv blocks must lie within the chunk's global_kv blocks")
        gview, lview = memoryview(chunk.global_kv), memoryview(chunk.local_kv)
        for j in range(ng):
            i = g0 + j
            local = lview[(i - l0) * lb : (i - l0 + 1) * lb] if l0 <= i < l0 + nl else None
            session.add_block(i, gview[j * gb : (j + 1) * gb], local)
        metrics.PUT_BYTES.labels(GRPC).inc(len(chunk.global_kv) + len(chunk.local_kv))

    async def PrepareSharedPut(
        self, request: pb.PrepareSharedPutRequest, context: grpc.aio.ServicerContext
    ) -> pb.PrepareSharedPutResponse:
        header = request.header
        namespace = check_namespace(header.namespace)
        layout = layout_from_proto(header.layout, "header.layout")
        token_bytes = check_tokens(header.token_ids_le32, "header.token_ids_le32")
        check_claim(namespace, header.claim, self._grant_key, "header.claim", time.time())
        whole_blocks = len(token_bytes) // layout.block_key_bytes
        if request.num_blocks > whole_blocks:
            raise InvalidArgument(
                f"num_blocks: {request.num_blocks} exceeds the {whole_blocks} whole blocks of the tokens"
            )
        local_blocks = frozenset(request.local_block_indices)
        if local_blocks and (layout.local_bytes_per_block == 0 or max(local_blocks) >= request.num_blocks):
            raise InvalidArgument("local_block_indices: must be < num_blocks, and the layout must have local KV")
        # The writer's word on its earlier leases first: expired ones it is done with free their space.
        self._store.writer_progress(request.writer_id, request.writes_done_below_generation)
        try:
            lease, slots, existing = self._store.prepare_shared_put(
                namespace,
                layout,
                token_bytes,
                header.conversation_id,
                request.num_blocks,
                local_blocks,
                request.first_block_index,
                peer=peer_key(context),
                writer=request.writer_id,
            )
        except LayoutMismatch as exc:
            raise InvalidArgument(str(exc)) from None
        except LeaseLimit as exc:
            raise ResourceExhausted(str(exc), retry_after_ms=int(self._store.lease_ttl_s * 1000)) from None
        except UnknownWriter as exc:
            raise FailedPrecondition(f"{exc} (map the arena, which takes the lock, then ask again)") from None
        self._sync_evictions()
        response = pb.PrepareSharedPutResponse(
            lease_id=lease,
            shm_name=self._store.arena.name,
            existing_blocks=existing,
            lease_ttl_ms=int(self._store.lease_ttl_s * 1000),
            generation=self._store.lease_generation(lease),
        )
        for s in slots:
            response.slots.add(
                block_index=s.block_index,
                write_global=s.global_extent is not None,
                global_offset=s.global_extent.offset if s.global_extent is not None else 0,
                write_local=s.local_extent is not None,
                local_offset=s.local_extent.offset if s.local_extent is not None else 0,
            )
        return response

    async def CommitSharedPut(
        self, request: pb.CommitSharedPutRequest, context: grpc.aio.ServicerContext
    ) -> pb.CommitSharedPutResponse:
        store = self._store
        lease_id = request.lease_id
        self._refuse_if_expired(lease_id)
        slots = store.put_slots(lease_id)
        if slots is None:
            raise NotFound(f"lease_id: no prepared put {lease_id!r} (released, or never granted)")
        # The lease owns these extents (an expiry meanwhile only quarantines them): large puts are read
        # off the event loop, small ones inline (a thread hop costs more than the checksum).
        check = (unwritten_slot, store.arena, slots, list(request.global_crc32), list(request.local_crc32))
        num_bytes = sum(e.length for slot in slots for e in (slot.global_extent, slot.local_extent) if e is not None)
        problem = await asyncio.to_thread(*check) if num_bytes > INLINE_CHECK_BYTES else check[0](*check[1:])
        if problem is not None:
            if store.put_slots(lease_id) is slots or store.revoked(lease_id):
                store.release_lease(lease_id)  # the writer is done with it either way
            metrics.REFUSED_COMMITS.inc()
            raise FailedPrecondition(f"{problem}; nothing was stored")
        self._refuse_if_expired(lease_id)  # it may have expired while its bytes were checked
        counts = store.commit_shared_put(lease_id)
        if counts is None:
            raise NotFound(f"lease_id: no prepared put {lease_id!r} (released, or never granted)")
        metrics.PUT_BYTES.labels(SHM).inc(counts.stored_bytes)
        return pb.CommitSharedPutResponse(counts=counts_to_proto(counts))

    def _refuse_if_expired(self, lease_id: str) -> None:
        """FAILED_PRECONDITION for the commit of an expired put lease: its writer was too late, and is
        done with it now, so its quarantined space is freed."""
        store = self._store
        if store.revoked(lease_id):
            store.commit_shared_put(lease_id)
            metrics.REFUSED_COMMITS.inc()
            raise FailedPrecondition(
                f"lease_id: the put lease {lease_id!r} expired before this commit (leases last "
                f"{int(store.lease_ttl_s * 1000)} ms); nothing was stored"
            )

    # ---- leases, stats, drop -------------------------------------------------------------------

    async def ReleaseLease(
        self, request: pb.ReleaseLeaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseLeaseResponse:
        return pb.ReleaseLeaseResponse(released=self._store.release_lease(request.lease_id))

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.GetStatsResponse:
        stats = self._store.tree.stats()
        c = self._store.counters
        return pb.GetStatsResponse(
            used_bytes=stats.used_bytes,
            capacity_bytes=stats.capacity_bytes,
            num_blocks=stats.num_blocks,
            query_tokens=c.query_tokens,
            hit_tokens=c.hit_tokens,
            evicted_blocks=stats.evicted_blocks,
            started_at_unix_ms=self._started_at_unix_ms,
            num_local_blocks=stats.num_local_blocks,
            evicted_local_blocks=stats.evicted_local_blocks,
            matched_tokens=c.matched_tokens,
            num_leases=self._store.num_leases,
            num_namespaces=stats.num_namespaces,
            shm_name=self._store.arena.name,
            quarantined_bytes=self._store.quarantined_bytes,
        )

    async def Drop(self, request: pb.DropRequest, context: grpc.aio.ServicerContext) -> pb.DropResponse:
        namespace = check_namespace(request.namespace)
        check_claim(namespace, request.claim, self._grant_key, "claim", time.time())
        return pb.DropResponse(dropped_blocks=self._store.drop(namespace, request.conversation_id))

    def _sync_evictions(self) -> None:
        tree = self._store.tree
        seen_blocks, seen_local = self._evicted_seen
        metrics.EVICTED_BLOCKS.inc(tree.evicted_blocks - seen_blocks)
        metrics.EVICTED_LOCAL_BLOCKS.inc(tree.evicted_local_blocks - seen_local)
        self._evicted_seen = (tree.evicted_blocks, tree.evicted_local_blocks)


def _plan_bytes(plan, first_global: int, layout: KVLayout) -> int:
    return (len(plan.nodes) - first_global) * layout.global_bytes_per_block + (
        len(plan.nodes) - plan.local_from_block
    ) * layout.local_bytes_per_block
