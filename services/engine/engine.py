"""The engine core: one synchronous step loop over scheduler, model runner and output states.

    step():  schedule -> load fetched host KV -> run the model -> record computed tokens
             -> append sampled tokens -> stop checks / text deltas -> retire finished requests

Prefix caching (when enabled): a request about to be admitted takes the longer of its device hit
(prefix_cache.py) and the KV fetched from the kvstore before admission (host_cache.py); a finished
or preempted request's blocks go to the device cache, and their KV to the kvstore (`host_sink`).

Not thread-safe: exactly one thread (async_engine.EngineLoop) calls it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.backend import select_ops
from services.engine import metrics
from services.engine.block_manager import BlockTable, KVCacheManager
from services.engine.config import SchedulerConfig
from services.engine.kv_cache import KVCache
from services.engine.host_cache import HostPrefix, HostPut
from services.engine.kv_layout import KVCacheLayout, plan_layout
from services.engine.kv_transfer import GLOBAL, LOCAL, local_start_block, pack_blocks, unpack_blocks
from services.engine.model_runner import ModelRunner
from services.engine.prefix_cache import DevicePrefixCache
from services.engine.output import OutputState, RequestEvent, final_stats
from services.engine.request import FinishReason, Request
from services.engine.sampler import advance_generator
from services.engine.scheduler import Scheduler


@dataclass(frozen=True)
class StepStats:
    num_batched_tokens: int
    num_sequences: int
    num_sampled: int
    duration_s: float
    num_preempted: int


class EngineCore:
    def __init__(self, model, tokenizer, scheduler_config: SchedulerConfig, block_size_tokens: int,
                 kv_cache_bytes: int, device: str = "cpu", prefix_caching: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        self.layout: KVCacheLayout = plan_layout(self.config, block_size_tokens, kv_cache_bytes)
        self.kv_cache = KVCache(self.layout, device)
        self.kv_manager = KVCacheManager(self.layout)
        self.scheduler = Scheduler(scheduler_config, self.kv_manager)
        self.runner = ModelRunner(model, self.kv_cache, select_ops(device), device)
        self._outputs: dict[str, OutputState] = {}
        self.last_step: StepStats | None = None
        self.prefix_cache = DevicePrefixCache(self.kv_manager) if prefix_caching else None
        # Receives the KV of retired requests for the kvstore (set by the engine loop when one is configured).
        self.host_sink: Callable[[HostPut], None] | None = None
        if self.prefix_cache is not None:
            self.scheduler.prefix_hook = self._attach_cached_prefix
            self.scheduler.preempt_hook = lambda request: self._retire_blocks(request, keep=True)

    # ---- queries -------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def has_request(self, request_id: str) -> bool:
        return request_id in self._outputs

    def max_blocks_for(self, num_tokens: int) -> int:
        return self.kv_manager.max_blocks_for_tokens(num_tokens, self.scheduler.config.max_num_batched_tokens)

    # ---- commands ------------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self._outputs:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        # The seeded sampler skips the draws of the tokens another engine already streamed.
        for _ in range(request.num_resumed_tokens):
            advance_generator(request.generator)
        self._outputs[request.request_id] = OutputState(request, self.tokenizer)
        self.scheduler.add(request)

    def finish_request(self, request_id: str, reason: FinishReason, error: str | None = None) -> RequestEvent | None:
        """End a request from outside the step (abort, deadline, error); frees its blocks at once."""
        state = self._outputs.pop(request_id, None)
        if state is None:
            return None
        self._retire_blocks(state.request, keep=reason is not FinishReason.ERROR)
        self.scheduler.remove(state.request)
        return RequestEvent(request_id, [], [], "", reason, final_stats(state.request), error)

    def fail_all(self, error: str) -> list[RequestEvent]:
        return [e for rid in list(self._outputs) if (e := self.finish_request(rid, FinishReason.ERROR, error))]

    def step(self) -> list[RequestEvent]:
        t0 = time.monotonic()
        output = self.scheduler.schedule()
        if output.is_empty:
            return []
        now = time.monotonic()
        for chunk in output.chunks:
            if chunk.request.first_scheduled_s is None:
                chunk.request.first_scheduled_s = now
        self._load_host_prefixes(output)
        sampled = self.runner.execute(output)
        self.scheduler.on_computed(output)
        now = time.monotonic()
        events: list[RequestEvent] = []
        sampled_chunks = [c for c in output.chunks if c.needs_sample]
        for chunk, token in zip(sampled_chunks, sampled):
            request = chunk.request
            state = self._outputs[request.request_id]
            request.output_token_ids.append(token.token_id)
            if request.first_token_s is None:
                request.first_token_s = now
            request.last_token_s = now
            text, finish = state.on_token(token.token_id)
            logprobs = [token.logprob] if token.logprob is not None else []
            final = None
            if finish is not None:
                self._outputs.pop(request.request_id)
                self._retire_blocks(request, keep=True)
                self.scheduler.remove(request)
                final = final_stats(request, now)
            events.append(RequestEvent(request.request_id, [token.token_id], logprobs, text, finish, final))
        self.last_step = StepStats(output.num_batched_tokens, len(output.chunks), len(sampled),
                                   time.monotonic() - t0, len(output.preempted))
        return events


    # ---- prefix caching ------------------------------------------------------------------------
    def _attach_cached_prefix(self, request: Request) -> None:
        """Before admission: start the request from the longer of its device hit and its fetched host KV."""
        request.prefix_looked_up = True
        host: HostPrefix | None = request.host_prefix  # type: ignore[assignment]
        request.host_prefix = None
        if request.namespace is None or self.prefix_cache is None or self.kv_manager.has_blocks(request.request_id):
            return
        bs = self.layout.block_size_tokens
        tokens = request.token_slice(0, request.num_tokens)
        # At least the last token is computed: its logits give the next token.
        max_tokens = (request.num_tokens - 1) // bs * bs
        metrics.PREFIX_QUERY_TOKENS.inc(request.num_prompt_tokens)
        hashes = request.block_hashes(max_tokens, bs)
        device_tokens = self.prefix_cache.peek_usable_tokens(hashes, tokens, max_tokens)
        host_tokens = host.num_tokens if host is not None and host.num_tokens <= max_tokens else 0
        retain_from = request.retain_local_from
        if host_tokens > device_tokens:
            request.num_computed_tokens = host_tokens
            request.num_cached_host_tokens = host_tokens
            request.pending_host_kv = host
            # Sliding-window blocks before the fetched window hold nothing: never keep them.
            floor = host.local_first_block * bs
            retain_from = floor if retain_from is None else max(retain_from, floor)
            metrics.PREFIX_HIT_TOKENS.labels("host").inc(host_tokens)
        elif device_tokens > 0:
            taken = self.prefix_cache.take(hashes, tokens, max_tokens)
            if taken is not None:
                tables, num_tokens = taken
                self.kv_manager.adopt(request.request_id, tables)
                request.num_computed_tokens = num_tokens
                request.num_cached_device_tokens = num_tokens
                metrics.PREFIX_HIT_TOKENS.labels("device").inc(num_tokens)
        self.kv_manager.set_retention(request.request_id, retain_from)

    def _load_host_prefixes(self, output) -> None:
        """Write fetched host KV into the blocks just allocated for it (first step of such a request)."""
        bs = self.layout.block_size_tokens
        for chunk in output.chunks:
            host: HostPrefix | None = chunk.request.pending_host_kv  # type: ignore[assignment]
            if host is None:
                continue
            num_blocks = host.num_tokens // bs
            unpack_blocks(self.kv_cache, chunk.block_tables, range(num_blocks), GLOBAL, host.global_kv)
            if host.local_kv.shape[0]:
                unpack_blocks(self.kv_cache, chunk.block_tables, range(host.local_first_block, num_blocks),
                              LOCAL, host.local_kv)
            chunk.request.pending_host_kv = None

    def _retire_blocks(self, request: Request, keep: bool) -> None:
        """Take a leaving request's blocks: into the device cache (and its KV to the kvstore) or free."""
        if self.prefix_cache is None:
            return
        request.pending_host_kv = None
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
        block_tokens = tokens[:num_blocks * bs]
        if self.host_sink is not None:
            self.host_sink(self._host_put(request, tables, block_tokens, num_blocks))
        self.prefix_cache.insert(request.namespace, tokens, tables, request.block_hashes(num_blocks * bs, bs))

    def _host_put(self, request: Request, tables: list[BlockTable], block_tokens: list[int],
                  num_blocks: int) -> HostPut:
        local_first = local_start_block(self.layout, tables, num_blocks)
        local = pack_blocks(self.kv_cache, tables, range(local_first, num_blocks), LOCAL) \
            if local_first < num_blocks else None
        return HostPut(request.namespace, block_tokens, pack_blocks(self.kv_cache, tables, range(num_blocks), GLOBAL),
                       local, local_first, request.conversation_id)


def make_request_stop_ids(config, extra: tuple[int, ...]) -> frozenset[int]:
    return frozenset(config.eos_token_ids) | frozenset(extra)


def warmup(core: EngineCore, prompt_len: int = 24, new_tokens: int = 4) -> None:
    """Run one short greedy request to the end (first-call costs paid before SERVING)."""
    from services.engine.request import RequestId, SamplingParams

    request = Request(
        request_id=RequestId("__warmup__"),
        prompt_token_ids=[core.config.bos_token_id] + [1000 + i for i in range(prompt_len - 1)],
        sampling=SamplingParams(max_new_tokens=new_tokens),
        stop_token_ids=frozenset(),
        max_context_tokens=core.config.max_context_tokens,
    )
    core.add_request(request)
    with torch.inference_mode():
        while core.has_request(request.request_id):
            core.step()
