"""Continuous batching: which requests compute which tokens in the next step.

Every step has a token budget shared by everything in it. Running requests come first, oldest
first: a decoding request takes 1 token, a prefilling one takes the rest of its prompt up to the
remaining budget (chunked prefill, so a long prompt never stalls the decodes). Then waiting requests
are admitted, oldest first, while budget, batch slots and KV blocks last.

When the blocks a running request needs are not free, the newest running request is preempted
(its blocks are freed and it goes back to the head of the queue; its tokens are recomputed when it
is readmitted). Newest-first preemption and oldest-first admission keep the order fair: a request
is never preempted to make room for one that arrived after it.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from services.engine.block_manager import BlockTable, KVCacheManager
from services.engine.config import SchedulerConfig
from services.engine.request import Request, RequestId, RequestStatus


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens [start_position, start_position + len(token_ids)) of one request, computed this step."""

    request: Request
    token_ids: list[int]
    start_position: int
    # Per KV cache group (kv_layout.py), the request's block table after allocation.
    block_tables: list[BlockTable]
    # True when the chunk reaches the request's last token: its logits row is sampled.
    needs_sample: bool

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk]
    preempted: list[RequestId]

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        # Sorted by arrival: the tail is the preemption victim.
        self.running: list[Request] = []
        self.num_preemptions = 0
        # Prefix caching (engine.py): consulted when a request is about to be admitted with nothing
        # computed; told when a request is preempted, before its blocks are freed.
        self.prefix_hook: Callable[[Request], None] | None = None
        self.preempt_hook: Callable[[Request], None] | None = None

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def find(self, request_id: str) -> Request | None:
        for r in self.running:
            if r.request_id == request_id:
                return r
        for r in self.waiting:
            if r.request_id == request_id:
                return r
        return None

    # ---- commands ------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a request out (finished, aborted, failed) and return all its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request.request_id)
        request.status = RequestStatus.FINISHED

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[RequestId] = []
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self.kv.allocate_slots(request.request_id, request.num_computed_tokens, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                chunks.append(self._chunk(request, num_new))
                budget -= num_new
                i += 1
        # No admission in a step that had to preempt: the pool is short.
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.config.max_num_running:
            request = self.waiting[0]
            if self.prefix_hook is not None and not request.prefix_looked_up:
                self.prefix_hook(request)
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self.kv.allocate_slots(request.request_id, request.num_computed_tokens, num_new):
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            bisect.insort(self.running, request, key=lambda r: r.arrival_s)
            chunks.append(self._chunk(request, num_new))
            budget -= num_new
        return SchedulerOutput(chunks, preempted)

    def _chunk(self, request: Request, num_new: int) -> ScheduledChunk:
        start = request.num_computed_tokens
        return ScheduledChunk(
            request=request,
            token_ids=request.token_slice(start, start + num_new),
            start_position=start,
            block_tables=self.kv.block_tables(request.request_id),
            needs_sample=start + num_new == request.num_tokens,
        )

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        if self.preempt_hook is not None:
            self.preempt_hook(request)
        self.kv.free(request.request_id)
        request.prefix_looked_up = False
        request.num_cached_device_tokens = request.num_cached_host_tokens = 0
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.num_preemptions += 1
        # Back to the head of the queue, ahead of everything that arrived later.
        pos = 0
        while pos < len(self.waiting) and self.waiting[pos].arrival_s <= request.arrival_s:
            pos += 1
        self.waiting.insert(pos, request)

    def on_computed(self, output: SchedulerOutput) -> None:
        """Record that the step's chunks were computed (before sampled tokens are appended)."""
        for chunk in output.chunks:
            chunk.request.num_computed_tokens = chunk.start_position + chunk.num_tokens
