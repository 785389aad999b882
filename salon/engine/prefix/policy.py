"""The engine's prefix caching: which cached prefix a request starts from, and where a leaving
request's KV goes.

    lookup   (query)    the longer of the device hit (prefix/device_cache.py) and the host hit the request
                        was submitted with (prefix/host_cache.py fetched it before admission)
    take     (command)  hand a device hit's block tables over to the request that starts from it
    retire   (command)  a finished or preempted request's blocks go to the device cache (reclaimable),
                        and their KV to the kvstore through `host_sink`; or they are freed

The scheduler calls lookup/take at admission and retire at preemption; the engine core calls retire
when a request ends. Engine thread only, except `device_hit_tokens` (any thread, for the servicer).
"""

from __future__ import annotations

from collections.abc import Callable

from salon.engine.kv.kv_cache import KVCache
from salon.engine.kv.kv_cache_manager import KVCacheManager
from salon.engine.kv.kv_layout import BlockTable
from salon.engine.kv.kv_transfer import GLOBAL, LOCAL, copy_to_host, local_start_block, pack_blocks
from salon.engine.prefix.device_cache import DevicePrefixCache
from salon.engine.prefix.hit import PrefixHit, better_hit, cacheable_prefix_tokens
from salon.engine.prefix.host_cache import HostPut
from salon.engine.request import Request


class PrefixCaching:
    def __init__(self, kv_manager: KVCacheManager, kv_cache: KVCache) -> None:
        self.kv_manager = kv_manager
        self.kv_cache = kv_cache
        self.layout = kv_cache.layout
        self.device = DevicePrefixCache(kv_manager)
        # Receives the KV of retired requests for the kvstore (set when one is configured).
        self.host_sink: Callable[[HostPut], None] | None = None

    # ---- queries -------------------------------------------------------------------------------
    def device_hit_tokens(self, request: Request) -> int:
        """Tokens of the request's context the device cache holds now (any thread: a hint)."""
        hit = self.device.lookup(request)
        return 0 if hit is None else hit.num_tokens

    def lookup(self, request: Request, host_hit: PrefixHit | None) -> PrefixHit | None:
        """The longer of the request's device hit and host_hit (the device one on a tie)."""
        max_tokens = cacheable_prefix_tokens(request.num_tokens, self.layout.block_size_tokens)
        if host_hit is not None and host_hit.num_tokens > max_tokens:
            host_hit = None
        return better_hit(self.device.lookup(request), host_hit)

    # ---- commands ------------------------------------------------------------------------------
    def take_device_hit(self, hit: PrefixHit) -> list[BlockTable]:
        return self.device.take(hit)

    def retire(self, request: Request, keep: bool) -> None:
        """Take a leaving request's blocks: into the device cache (and its KV to the kvstore) or free."""
        tables = self.kv_manager.detach(request.request_id)
        if tables is None:
            return
        bs = self.layout.block_size_tokens
        num_tokens = request.num_computed_tokens
        num_blocks = num_tokens // bs
        if not keep or request.namespace is None or num_blocks == 0:
            self.kv_manager.free_tables(tables)
            return
        tokens = request.token_slice(0, num_tokens)
        if self.host_sink is not None and request.host_cacheable:
            self.host_sink(self._host_put(request, tables, tokens[: num_blocks * bs], num_blocks))
        self.device.insert(
            request.namespace, tokens, tables, request.block_hashes(num_blocks * bs, bs), request.conversation_id
        )

    def _host_put(
        self, request: Request, tables: list[BlockTable], block_tokens: list[int], num_blocks: int
    ) -> HostPut:
        assert request.namespace is not None
        local_first = local_start_block(self.layout, tables, num_blocks)
        # Gathered on the step's stream; the device->host copy runs beside the next steps (copy_to_host).
        global_kv, global_ready = copy_to_host(
            pack_blocks(self.kv_cache, tables, range(num_blocks), GLOBAL, to_host=False)
        )
        local, local_ready = None, None
        if local_first < num_blocks:
            local, local_ready = copy_to_host(
                pack_blocks(self.kv_cache, tables, range(local_first, num_blocks), LOCAL, to_host=False)
            )
        waits = [w for w in (global_ready, local_ready) if w is not None]
        return HostPut(
            request.namespace,
            block_tokens,
            global_kv,
            local,
            local_first,
            request.conversation_id,
            ready=(lambda: [w() for w in waits]) if waits else None,
        )
