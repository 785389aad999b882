"""The engine's side of the cross-turn cache in the kvstore (host memory, shared by a host's engines).

    before admission (event loop):  match → usable prefix → fetch its KV        → a host PrefixHit,
                                    submitted with the request (core/engine_loop.py)
    at admission (engine thread):   the scheduler takes the longer of it and the device hit; the
                                    fetched KV is written into the request's new blocks at its first step
    after the reply (event loop):   put(prompt + reply KV), queued off the TTFT path   ← HostPut

The kvstore is a cache, and a slow or dead one must never fail or delay a request beyond a bound:
every call has a timeout, any failure is a miss (the engine recomputes), puts are dropped when too
many are in flight, and the client reconnects by itself when the kvstore comes back. A reply whose
KV does not have exactly the layout's shape is a miss too: the step never sees malformed KV.

Writes name their tenant: the servicer notes each request's namespace grant (`note_grant`), and
puts and drops of that namespace carry it to the kvstore as a NamespaceClaim. `drop_conversation`
waits for the dialogue's puts still in flight, so nothing of it is stored again after the drop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from salon.common.kvstore_contract.client import FetchResult, KVStoreClient, NamespaceClaim
from salon.common.kvstore_contract.layout import KVLayout
from salon.common.logging import get_logger
from salon.engine import metrics
from salon.engine.prefix.hit import PrefixHit, host_hit

log = get_logger(__name__)


@dataclass(frozen=True)
class HostPut:
    """KV of a finished (or preempted) request, to store in the kvstore."""

    namespace: bytes
    token_ids: list[int]  # whole blocks only
    global_kv: torch.Tensor
    local_kv: torch.Tensor | None
    local_first_block: int
    conversation_id: str
    # Blocks until global_kv / local_kv hold their bytes (a device->host copy still running); None: they do.
    ready: Callable[[], object] | None = None


class HostCache:
    def __init__(
        self,
        client: KVStoreClient,
        layout: KVLayout,
        timeout_s: float = 1.0,
        max_puts_in_flight: int = 8,
        model_id: str = "",
        layout_tag: str = "",
    ) -> None:
        self.client = client
        self.layout = layout
        self.timeout_s = timeout_s
        self.max_puts_in_flight = max_puts_in_flight
        self.model_id = model_id
        self.layout_tag = layout_tag
        # In-flight puts -> (namespace, conversation id) they store.
        self._puts: dict[asyncio.Task, tuple[bytes, str]] = {}
        # Namespace -> the latest claim a request brought for it (one per tenant).
        self._claims: dict[bytes, NamespaceClaim] = {}

    def note_grant(self, namespace: bytes, salt: str, grant: bytes) -> None:
        """Remember the gateway's grant for a namespace (event loop); empty grants are not kept."""
        if grant:
            claim = self._claims.get(namespace)
            if claim is None or claim.grant != grant:
                self._claims[namespace] = NamespaceClaim(salt, self.model_id, self.layout_tag, grant)

    async def lookup(
        self, namespace: bytes, token_ids: Sequence[int], max_tokens: int, min_tokens: int
    ) -> PrefixHit | None:
        """The longest usable stored prefix of token_ids[:max_tokens], if longer than min_tokens."""
        if max_tokens <= min_tokens:
            metrics.HOST_CACHE_CALLS.labels("lookup", "skipped").inc()
            return None
        started = time.monotonic()
        deadline = started + self.timeout_s
        match = await self.client.match(namespace, token_ids[:max_tokens], self.layout, timeout_s=self.timeout_s)
        if match.usable_tokens <= min_tokens:
            metrics.HOST_CACHE_CALLS.labels("lookup", "miss").inc()
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            metrics.HOST_CACHE_CALLS.labels("lookup", "error").inc()
            return None
        fetched = await self.client.fetch(
            namespace, token_ids[:max_tokens], self.layout, max_tokens=match.usable_tokens, timeout_s=remaining
        )
        metrics.HOST_CACHE_LOOKUP.observe(time.monotonic() - started)
        hit = self._to_hit(fetched)
        outcome = "ok" if hit is not None and hit.num_tokens > min_tokens else "miss"
        metrics.HOST_CACHE_CALLS.labels("lookup", outcome).inc()
        return hit if outcome == "ok" else None

    def _to_hit(self, fetched: FetchResult) -> PrefixHit | None:
        """The fetched KV as a host hit, or None unless it has exactly the layout's shape."""
        layout = self.layout
        bs = layout.block_size_tokens
        n = fetched.num_tokens
        if n <= 0 or n % bs or fetched.first_global_block != 0:
            return None
        num_blocks = n // bs
        expect = (num_blocks, layout.global_bytes_per_block)
        if fetched.global_kv.dtype != np.uint8 or fetched.global_kv.shape != expect:
            return None
        needed_from = num_blocks - layout.needed_local_blocks(num_blocks)
        if layout.sliding_window_tokens:
            if not 0 <= fetched.local_from_block <= needed_from:
                return None  # not enough window KV came back: recompute rather than guess
            expect = (num_blocks - fetched.local_from_block, layout.local_bytes_per_block)
            if fetched.local_kv.dtype != np.uint8 or fetched.local_kv.shape != expect:
                return None
        return host_hit(
            n, torch.from_numpy(fetched.global_kv), torch.from_numpy(fetched.local_kv), fetched.local_from_block
        )

    def store(self, put: HostPut) -> None:
        """Queue a put (event loop thread); dropped when too many are already in flight."""
        if len(self._puts) >= self.max_puts_in_flight:
            metrics.HOST_CACHE_CALLS.labels("put", "skipped").inc()
            return
        task = asyncio.get_running_loop().create_task(self._put(put))
        self._puts[task] = (put.namespace, put.conversation_id)
        task.add_done_callback(lambda t: self._puts.pop(t, None))

    async def _put(self, put: HostPut) -> None:
        if put.ready is not None:
            await asyncio.to_thread(put.ready)
        local = put.local_kv.numpy() if put.local_kv is not None and put.local_kv.shape[1] else None
        result = await self.client.put(
            put.namespace,
            put.token_ids,
            self.layout,
            put.global_kv.numpy(),
            local,
            local_first_block=put.local_first_block,
            conversation_id=put.conversation_id,
            claim=self._claims.get(put.namespace),
            timeout_s=max(self.timeout_s, 5.0),
        )
        metrics.HOST_CACHE_CALLS.labels("put", "error" if result is None else "ok").inc()

    async def drop_conversation(self, namespace: bytes, conversation_id: str) -> int | None:
        """Erase a dialogue from the kvstore once its in-flight puts are done: blocks removed, or None
        if the kvstore did not confirm."""
        pending = [t for t, key in self._puts.items() if key == (namespace, conversation_id)]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return await self.client.drop(
            namespace, conversation_id, claim=self._claims.get(namespace), timeout_s=max(self.timeout_s, 5.0)
        )

    async def drain(self) -> None:
        """Wait for queued puts (tests, shutdown)."""
        while self._puts:
            await asyncio.gather(*list(self._puts), return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        await self.client.close()
