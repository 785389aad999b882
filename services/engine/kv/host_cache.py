"""The engine's side of the cross-turn cache in the kvstore (host memory, shared by a host's engines).

    before admission (event loop):  match → usable prefix → fetch its KV        → a host PrefixHit,
                                    submitted with the request (core/engine_loop.py)
    at admission (engine thread):   the scheduler takes the longer of it and the device hit; the
                                    fetched KV is written into the request's new blocks at its first step
    after the reply (event loop):   put(prompt + reply KV), queued off the TTFT path   ← HostPut

The kvstore is a cache, and a slow or dead one must never fail or delay a request beyond a bound:
every call has a timeout, any failure is a miss (the engine recomputes), puts are dropped when too
many are in flight, and the client reconnects by itself when the kvstore comes back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.common.kvstore_client.client import FetchResult, KVStoreClient
from services.common.kvstore_client.layout import KVLayout
from services.common.logging import get_logger
from services.engine import metrics
from services.engine.kv.prefix_hit import PrefixHit, host_hit

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


class HostCache:
    def __init__(self, client: KVStoreClient, layout: KVLayout, timeout_s: float = 1.0,
                 max_puts_in_flight: int = 8) -> None:
        self.client = client
        self.layout = layout
        self.timeout_s = timeout_s
        self.max_puts_in_flight = max_puts_in_flight
        self._puts: set[asyncio.Task] = set()

    async def lookup(self, namespace: bytes, token_ids: Sequence[int], max_tokens: int,
                     min_tokens: int) -> PrefixHit | None:
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
        fetched = await self.client.fetch(namespace, token_ids[:max_tokens], self.layout,
                                          max_tokens=match.usable_tokens, timeout_s=remaining)
        metrics.HOST_CACHE_LOOKUP.observe(time.monotonic() - started)
        hit = self._to_hit(fetched)
        outcome = "ok" if hit is not None and hit.num_tokens > min_tokens else "miss"
        metrics.HOST_CACHE_CALLS.labels("lookup", outcome).inc()
        return hit if outcome == "ok" else None

    def _to_hit(self, fetched: FetchResult) -> PrefixHit | None:
        bs = self.layout.block_size_tokens
        n = fetched.num_tokens
        if n <= 0 or fetched.first_global_block != 0 or fetched.global_kv.shape[0] != n // bs:
            return None
        needed_from = n // bs - self.layout.needed_local_blocks(n // bs)
        if self.layout.sliding_window_tokens and fetched.local_from_block > needed_from:
            return None  # not enough window KV came back: recompute rather than guess
        return host_hit(n, torch.from_numpy(fetched.global_kv), torch.from_numpy(fetched.local_kv),
                        fetched.local_from_block)

    def store(self, put: HostPut) -> None:
        """Queue a put (event loop thread); dropped when too many are already in flight."""
        if len(self._puts) >= self.max_puts_in_flight:
            metrics.HOST_CACHE_CALLS.labels("put", "skipped").inc()
            return
        task = asyncio.get_running_loop().create_task(self._put(put))
        self._puts.add(task)
        task.add_done_callback(self._puts.discard)

    async def _put(self, put: HostPut) -> None:
        local = put.local_kv.numpy() if put.local_kv is not None and put.local_kv.shape[1] else None
        result = await self.client.put(
            put.namespace, put.token_ids, self.layout, put.global_kv.numpy(), local,
            local_first_block=put.local_first_block, conversation_id=put.conversation_id,
            timeout_s=max(self.timeout_s, 5.0))
        metrics.HOST_CACHE_CALLS.labels("put", "error" if result is None else "ok").inc()

    async def drain(self) -> None:
        """Wait for queued puts (tests, shutdown)."""
        while self._puts:
            await asyncio.gather(*list(self._puts), return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        await self.client.close()
