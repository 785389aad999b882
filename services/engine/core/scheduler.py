"""Continuous batching: which requests compute which tokens in the next step.

Every step has a token budget shared by everything in it. Running requests come first, oldest
first: a decoding request takes 1 token, a prefilling one takes the rest of its prompt up to the
remaining budget and at most `long_prefill_tokens` (chunked prefill, so a long prompt never stalls the
decodes). Then waiting requests are admitted, oldest first, while budget, batch slots and KV blocks
last, under the same cap. Whatever budget is left then goes to the prefills the cap cut, oldest first:
a long prefill alone still fills the step, but a returning turn's few new tokens (after a cache hit)
never wait behind another dialogue's long history.

When the blocks a running request needs are not free, the newest running request is preempted
(its blocks are freed and it goes back to the head of the queue; its tokens are recomputed when it
is readmitted). Newest-first preemption and oldest-first admission keep the order fair: a request
is never preempted to make room for one that arrived after it.

With prefix caching (prefix_caching.py), a request about to be admitted asks for its cached prefix
first: the longer of its device hit and the host hit it was submitted with. It starts from there
(a device hit's block tables are adopted, a host hit's KV rides on the request's first chunk to be
written into its fresh blocks), and only the rest is allocated and computed. A preempted request's
blocks are retired into the caches before they are freed.

Speculative decoding (config.speculative_tokens > 0) comes last, from the budget nothing else took:
a decoding request's chunk is its last token followed by draft tokens from its own context
(ngram_proposer.py), all computed in this step like a prefill chunk, every row sampled. The KV
slots of the drafts are allocated with the chunk; after sampling, `on_verified` keeps the
accepted drafts as computed tokens and gives back the blocks that only rejected ones used.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from services.engine import metrics
from services.engine.config import SchedulerConfig
from services.engine.core.kv_cache_manager import KVCacheManager
from services.engine.core.ngram_proposer import NgramProposer
from services.engine.core.prefix_caching import PrefixCaching
from services.engine.core.request import Request, RequestId, RequestStatus
from services.engine.kv.kv_layout import BlockTable
from services.engine.kv.prefix_hit import CacheSource, HostKV, PrefixHit


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
    # KV fetched from the kvstore for blocks [0, start_position / BS): written into the request's
    # blocks before the step runs (the first chunk after a host hit only).
    host_kv: HostKV | None = None
    # Speculative decoding: the chunk's last tokens are these drafts, not (yet) the request's; every
    # row from the request's last token on is sampled, and only accepted drafts become its tokens.
    draft_token_ids: tuple[int, ...] = ()

    @property
    def num_draft_tokens(self) -> int:
        return len(self.draft_token_ids)

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
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, prefix: PrefixCaching | None = None) -> None:
        self.config = config
        self.kv = kv
        self.prefix = prefix
        self.waiting: deque[Request] = deque()
        # Sorted by arrival: the tail is the preemption victim.
        self.running: list[Request] = []
        self.num_preemptions = 0
        # Host hits submitted with waiting requests, until their admission looks at them.
        self._offered_host_hits: dict[RequestId, PrefixHit] = {}
        # KV of the host hits that admission took, until the request's first chunk carries it.
        self._host_kv_to_load: dict[RequestId, HostKV] = {}
        self.proposer = NgramProposer(config.speculative_tokens, config.ngram_min, config.ngram_max) \
            if config.speculative_tokens > 0 else None

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- commands ------------------------------------------------------------------------------
    def add(self, request: Request, host_hit: PrefixHit | None = None) -> None:
        """Queue a request; host_hit: KV the kvstore gave for its context (used if it beats the device)."""
        request.status = RequestStatus.WAITING
        if host_hit is not None:
            if host_hit.host_kv is None:
                raise ValueError("host_hit must carry its KV (a kvstore hit or a copy from a running request)")
            self._offered_host_hits[request.request_id] = host_hit
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a request out (finished, aborted, failed) and return all its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._offered_host_hits.pop(request.request_id, None)
        self._host_kv_to_load.pop(request.request_id, None)
        if self.proposer is not None:
            self.proposer.forget(request.request_id)
        self.kv.free(request.request_id)
        request.status = RequestStatus.FINISHED

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        cap = self.config.long_prefill_tokens or budget
        planned: dict[RequestId, int] = {}  # tokens each scheduled request computes, in scheduling order
        order: list[Request] = []
        preempted: list[RequestId] = []
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget, cap)
            while not self.kv.allocate_slots(request.request_id, request.num_computed_tokens, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                planned[request.request_id] = num_new
                order.append(request)
                budget -= num_new
                i += 1
        # No admission in a step that had to preempt: the pool is short.
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.config.max_num_running:
            request = self.waiting[0]
            if self.prefix is not None and not request.prefix_looked_up:
                self._start_from_cached_prefix(request)
            num_new = min(request.num_tokens - request.num_computed_tokens, budget, cap)
            if not self.kv.allocate_slots(request.request_id, request.num_computed_tokens, num_new):
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            bisect.insort(self.running, request, key=lambda r: r.arrival_s)
            planned[request.request_id] = num_new
            order.append(request)
            budget -= num_new
        budget = self._extend_capped_prefills(order, planned, budget)
        drafts = self._propose_drafts(order, planned, budget) if not preempted else {}
        return SchedulerOutput([self._chunk(r, planned[r.request_id], drafts.get(r.request_id, ()))
                                for r in order], preempted)

    def _extend_capped_prefills(self, order: list[Request], planned: dict[RequestId, int], budget: int) -> int:
        """Give the budget left after every request had its (capped) turn to the prefills the cap cut,
        in scheduling order; no preemption for it. Returns the budget still left."""
        for request in order:
            if budget <= 0:
                break
            num_new = planned[request.request_id]
            more = min(request.num_tokens - request.num_computed_tokens - num_new, budget)
            if more > 0 and self.kv.allocate_slots(request.request_id, request.num_computed_tokens, num_new + more):
                planned[request.request_id] = num_new + more
                budget -= more
        return budget

    def _propose_drafts(self, order: list[Request], planned: dict[RequestId, int], budget: int
                        ) -> dict[RequestId, tuple[int, ...]]:
        """Speculative decoding, with the budget left after everything else: a decoding request gets draft
        tokens (ngram_proposer.py) to verify in its step, never more than its remaining max_new_tokens and
        context allow, and only while free blocks hold their KV (drafts reclaim no cached prefix and
        preempt nothing)."""
        drafts: dict[RequestId, tuple[int, ...]] = {}
        if self.proposer is None:
            return drafts
        for request in order:
            if budget <= 0:
                break
            rid = request.request_id
            computed = request.num_computed_tokens
            if planned[rid] != 1 or request.num_tokens - computed != 1 or not request.output_token_ids:
                continue  # a prefill chunk, or a request that has not sampled yet
            room = min(budget, request.sampling.max_new_tokens - request.num_output_tokens - 1,
                       request.max_context_tokens - request.num_tokens - 1)
            if room <= 0:
                continue
            proposal = self.proposer.propose(rid, request.token_slice(0, request.num_tokens), room)
            if not proposal:
                continue
            if self.kv.num_blocks_needed(rid, computed, 1 + len(proposal)) > self.kv.num_free_blocks:
                continue
            self.kv.allocate_slots(rid, computed, 1 + len(proposal))
            planned[rid] = 1 + len(proposal)
            drafts[rid] = tuple(proposal)
            budget -= len(proposal)
        return drafts

    def _start_from_cached_prefix(self, request: Request) -> None:
        """Before admission: start the request from the longest usable cached prefix of its context."""
        assert self.prefix is not None
        request.prefix_looked_up = True
        offered = self._offered_host_hits.pop(request.request_id, None)
        if request.namespace is None or self.kv.has_blocks(request.request_id):
            return
        metrics.PREFIX_CACHE_QUERIES.inc(request.num_prompt_tokens)
        hit = self.prefix.lookup(request, offered)
        retain_from = request.retain_local_from
        if hit is not None and hit.host_kv is not None:
            self._host_kv_to_load[request.request_id] = hit.host_kv
            # A copy of a running request's prompt KV (kv/prefix_fork.py) came from the device.
            if hit.source is CacheSource.DEVICE:
                request.num_cached_device_tokens = hit.num_tokens
            else:
                request.num_cached_host_tokens = hit.num_tokens
            # Sliding-window blocks before the fetched window hold nothing: never keep them.
            floor = hit.host_kv.local_first_block * self.kv.layout.block_size_tokens
            retain_from = floor if retain_from is None else max(retain_from, floor)
        elif hit is not None:
            self.kv.adopt(request.request_id, self.prefix.take_device_hit(hit))
            request.num_cached_device_tokens = hit.num_tokens
        if hit is not None:
            request.num_computed_tokens = hit.num_tokens
            metrics.PREFIX_CACHE_HITS.labels(hit.source.value).inc(hit.num_tokens)
        self.kv.set_retention(request.request_id, retain_from)

    def _chunk(self, request: Request, num_new: int, drafts: tuple[int, ...] = ()) -> ScheduledChunk:
        start = request.num_computed_tokens
        own = num_new - len(drafts)
        return ScheduledChunk(
            request=request,
            token_ids=request.token_slice(start, start + own) + list(drafts),
            start_position=start,
            block_tables=self.kv.block_tables(request.request_id),
            needs_sample=start + own == request.num_tokens,
            host_kv=self._host_kv_to_load.pop(request.request_id, None),
            draft_token_ids=drafts,
        )

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._host_kv_to_load.pop(request.request_id, None)
        if self.prefix is not None:
            self.prefix.retire(request, keep=True)
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
        """Record that the step's chunks were computed (before sampled tokens are appended); a chunk's
        draft tokens are not the request's tokens (yet): see on_verified."""
        for chunk in output.chunks:
            chunk.request.num_computed_tokens = chunk.start_position + chunk.num_tokens - chunk.num_draft_tokens

    def on_verified(self, chunk: ScheduledChunk, num_appended: int) -> None:
        """After a chunk with drafts appended num_appended tokens to its request (accepted drafts, then
        the one sampled after them; fewer when the request ended): the accepted drafts' KV is the
        request's now, the rejected ones' is dropped. The request holds exactly the blocks of its
        computed tokens again, as after a plain decode step, so only accepted tokens' blocks can ever
        be cached."""
        request = chunk.request
        request.num_computed_tokens = chunk.start_position + num_appended
        self.kv.truncate(request.request_id, request.num_computed_tokens)
