"""Continuous batching: which requests compute which tokens in the next step.

Every step has a token budget shared by everything in it. A request is *interactive* this step when what it
has left to compute fits the budget, so it completes in one step: a decode (1 token), a short prompt, a
returning turn's few new tokens after a cache hit; the others are *long* prefills (a dialogue's cold history),
and a long prefill stays long until its prompt is computed (its last chunk is no reason to go first). A step
is built in three passes:

  1. running interactive requests, oldest first, each whole;
  2. waiting requests in queue order (priority, lower first, then arrival): interactive ones are admitted
     whole while budget, batch slots and KV blocks last (a long one does not hold them back: it is taken in
     pass 3);
  3. long prefills, oldest first (running, then waiting): beside interactive work they share at most
     `long_prefill_tokens` minus the interactive prefill tokens, so a step with decodes or a returning turn
     stays short; a step of long prefills alone gives them `long_prefill_solo_tokens` (0: the whole budget).
     The oldest long prefill takes its share first, so long prefills finish in arrival order instead of all
     slowly together.

So a decode or a returning turn never waits behind another dialogue's long history for more than
`long_prefill_tokens` of its tokens per step, and a returning turn that arrives while long prefills run alone
waits at most for a step of `long_prefill_solo_tokens` (a step is never interrupted). On a CPU a step's cost
grows slowly with its rows while they are few (Gemma 3 270M served on 2 cores: a decode alone 12.6 ms, with 8
prefill tokens beside it 17.5 ms, 32 prefill tokens alone 24.0 ms), so the share beside decodes sets how fast cold
histories go while other dialogues stream: on the dialogue trace 32 tokens instead of 8 gave 1.11-1.17x the
steady turns/s for 1.10x the returning turns' TTFT p90 and 1.35x the ITL p50 (20 to 27 ms); solo steps of 64
instead of 32 gave 1.03-1.05x the steady turns/s for 1.11-1.20x the TTFT p90 (0.98-1.04x beside 8). Measured
by `salon bench --launch --preset llama-server` in alternated rounds (docs/benchmarks.md has the figures).
long_prefill_tokens = 0 turns the classes off: every request in arrival order, each step filled.

When the blocks a running request needs are not free, the newest running request is preempted
(its blocks are freed and it goes back to the head of the queue; its tokens are recomputed when it
is readmitted). Newest-first preemption and oldest-first admission keep the order fair: a request
is never preempted to make room for one that arrived after it, nor for one already in this step.

With prefix caching (prefix/policy.py), a request about to be admitted asks for its cached prefix
first: the longer of its device hit and the host hit it was submitted with. It starts from there
(a device hit's block tables are adopted, a host hit's KV rides on the request's first chunk to be
written into its fresh blocks), and only the rest is allocated and computed. A preempted request's
blocks are retired into the caches before they are freed.

Speculative decoding (config.speculative_tokens > 0) comes last, from the budget nothing else took:
a decoding request's chunk is its last token followed by draft tokens from its own context
(ngram_proposer.py), all computed in this step like a prefill chunk, every row sampled; never in a step
with an interactive prefill (a returning turn's first token would wait for the drafts' rows), and only while
the step's decodes with their drafts stay within `speculative_max_rows` rows. The KV
slots of the drafts are allocated with the chunk; after sampling, `on_verified` keeps the
accepted drafts as computed tokens and gives back the blocks that only rejected ones used. A constrained
request's drafts are cut at the first one its grammar does not allow (grammar/matcher.py `draft_prefix`: such
a draft could never be accepted, nor anything after it, nor anything past the stop token that ends the
grammar); the cut tokens are counted (`num_grammar_truncated_drafts`, and the
`salon_engine_spec_decode_grammar_truncated_tokens_total` counter).
"""

from __future__ import annotations

import bisect
from collections import deque

from salon.engine import metrics
from salon.engine.batch import HostKV, ScheduledChunk, SchedulerOutput
from salon.engine.config import SchedulerConfig
from salon.engine.core.ngram_proposer import NgramProposer
from salon.engine.kv.kv_cache_manager import KVCacheManager
from salon.engine.prefix.hit import CacheSource, PrefixHit
from salon.engine.prefix.policy import PrefixCaching
from salon.engine.request import Request, RequestId, RequestStatus


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, prefix: PrefixCaching | None = None) -> None:
        self.config = config
        self.kv = kv
        self.prefix = prefix
        # Sorted by (priority, arrival): admission takes them in this order.
        self.waiting: deque[Request] = deque()
        # Sorted by arrival: the tail is the preemption victim.
        self.running: list[Request] = []
        self.num_preemptions = 0
        # Host hits submitted with waiting requests, until their admission looks at them.
        self._offered_host_hits: dict[RequestId, PrefixHit] = {}
        # KV of the host hits that admission took, until the request's first chunk carries it.
        self._host_kv_to_load: dict[RequestId, HostKV] = {}
        self.proposer = (
            NgramProposer(config.speculative_tokens, config.ngram_min, config.ngram_max)
            if config.speculative_tokens > 0
            else None
        )
        # Requests whose prompt is being computed as a long prefill (pass 3 of schedule), until it is computed.
        self._long_prefills: set[RequestId] = set()
        # Draft tokens cut because the request's grammar does not allow them (never verified).
        self.num_grammar_truncated_drafts = 0

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
        bisect.insort(self.waiting, request, key=_queue_order)

    def remove(self, request: Request) -> None:
        """Take a request out (finished, aborted, failed) and return all its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._offered_host_hits.pop(request.request_id, None)
        self._host_kv_to_load.pop(request.request_id, None)
        self._long_prefills.discard(request.request_id)
        if self.proposer is not None:
            self.proposer.forget(request.request_id)
        self.kv.free(request.request_id)
        request.status = RequestStatus.FINISHED

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        # Long prefills' share beside interactive work; interactive: what has no more left than the budget
        # (long_prefill_tokens 0: nothing is, every request goes in arrival order).
        cap = min(self.config.long_prefill_tokens, budget)
        fits = budget if cap else 0
        planned: dict[RequestId, int] = {}  # tokens each scheduled request computes, in scheduling order
        order: list[Request] = []
        preempted: list[RequestId] = []
        long_running: list[Request] = []
        # 1. Running interactive requests, oldest first, each whole.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            remaining = request.num_tokens - request.num_computed_tokens
            if remaining > fits or request.request_id in self._long_prefills:
                long_running.append(request)
                i += 1
                continue
            num_new = min(remaining, budget)
            while not self.kv.allocate_slots(request.request_id, request.num_computed_tokens, num_new):
                victim = self.running[-1]  # never one already planned: those are older than this request
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                self._plan(request, num_new, planned, order)
                budget -= num_new
                i += 1
        long_running += [r for r in self.running[i:] if r.request_id not in planned]
        # 2. Waiting interactive requests in queue order. No admission in a step that had to preempt: the pool
        # is short.
        long_waiting: list[Request] = []
        for request in list(self.waiting):
            if budget <= 0 or preempted or len(self.running) >= self.config.max_num_running:
                break
            if self.prefix is not None and not request.prefix_looked_up:
                self._start_from_cached_prefix(request)
            remaining = request.num_tokens - request.num_computed_tokens
            if remaining > fits:
                long_waiting.append(request)
                continue
            if not self.kv.allocate_slots(request.request_id, request.num_computed_tokens, min(remaining, budget)):
                break
            self._admit(request, min(remaining, budget), planned, order)
            budget -= planned[request.request_id]
        # 3. Long prefills, oldest first: a cap's worth beside interactive work, else the solo cap's (or the
        # whole budget).
        share = budget
        interactive_prefill = sum(n for n in planned.values() if n > 1)  # returning turns' and short prompts' tokens
        if order:
            share = min(budget, max(0, cap - interactive_prefill))
        elif cap and self.config.long_prefill_solo_tokens:
            share = min(budget, self.config.long_prefill_solo_tokens)
        for request in long_running + (long_waiting if not preempted else []):
            if share <= 0:
                break
            num_new = min(request.num_tokens - request.num_computed_tokens, share)
            if request.status is RequestStatus.WAITING:
                if len(self.running) >= self.config.max_num_running or not self.kv.allocate_slots(
                    request.request_id, request.num_computed_tokens, num_new
                ):
                    break  # long prefills go in arrival order: none passes this one
                self._admit(request, num_new, planned, order)
            elif self._allocate_preempting_newer(request, num_new, planned, preempted):
                self._plan(request, num_new, planned, order)
            else:
                break
            if num_new < request.num_tokens - request.num_computed_tokens:
                self._long_prefills.add(request.request_id)
            else:
                self._long_prefills.discard(request.request_id)
            share -= num_new
            budget -= num_new
        drafts = self._propose_drafts(order, planned, budget) if not (preempted or interactive_prefill) else {}
        return SchedulerOutput(
            [self._chunk(r, planned[r.request_id], drafts.get(r.request_id, ())) for r in order], preempted
        )

    @staticmethod
    def _plan(request: Request, num_new: int, planned: dict[RequestId, int], order: list[Request]) -> None:
        planned[request.request_id] = num_new
        order.append(request)

    def _admit(self, request: Request, num_new: int, planned: dict[RequestId, int], order: list[Request]) -> None:
        """A waiting request whose slots are allocated joins the running batch with num_new tokens this step."""
        self.waiting.remove(request)
        request.status = RequestStatus.RUNNING
        bisect.insort(self.running, request, key=lambda r: r.arrival_s)
        self._plan(request, num_new, planned, order)

    def _allocate_preempting_newer(
        self, request: Request, num_new: int, planned: dict[RequestId, int], preempted: list[RequestId]
    ) -> bool:
        """Allocate a running request's slots, preempting (newest first) running requests that arrived after it
        and are not in this step; False when even that leaves too few blocks."""
        while not self.kv.allocate_slots(request.request_id, request.num_computed_tokens, num_new):
            victims = [r for r in self.running if r.arrival_s > request.arrival_s and r.request_id not in planned]
            if not victims:
                return False
            victim = victims[-1]
            self._preempt(victim)
            preempted.append(victim.request_id)
        return True

    def _propose_drafts(
        self, order: list[Request], planned: dict[RequestId, int], budget: int
    ) -> dict[RequestId, tuple[int, ...]]:
        """Speculative decoding, with the budget left after everything else: a decoding request gets draft
        tokens (ngram_proposer.py) to verify in its step, never more than its remaining max_new_tokens and
        context allow nor past what its grammar allows, and only while free blocks hold their KV (drafts reclaim
        no cached prefix and preempt nothing). Never in a step with an interactive prefill (schedule() asks only
        without one: a returning turn's first token would wait for the drafts' rows too; a long prefill's share is
        throughput work and does not keep them out), and only while the step's decodes with their drafts stay within
        speculative_max_rows rows (a decode step's cost is nearly flat in its rows up to a few)."""
        drafts: dict[RequestId, tuple[int, ...]] = {}
        if self.proposer is None:
            return drafts
        if self.config.speculative_max_rows:
            budget = min(budget, self.config.speculative_max_rows - sum(n == 1 for n in planned.values()))
        for request in order:
            if budget <= 0:
                break
            rid = request.request_id
            computed = request.num_computed_tokens
            if planned[rid] != 1 or request.num_tokens - computed != 1 or not request.output_token_ids:
                continue  # a prefill chunk, or a request that has not sampled yet
            room = min(
                budget,
                request.sampling.max_new_tokens - request.num_output_tokens - 1,
                request.max_context_tokens - request.num_tokens - 1,
            )
            if room <= 0:
                continue
            proposal = self.proposer.propose(rid, request.token_slice(0, request.num_tokens), room)
            if proposal and request.grammar is not None:
                allowed = request.grammar.draft_prefix(proposal)
                if allowed < len(proposal):
                    self.num_grammar_truncated_drafts += len(proposal) - allowed
                    metrics.SPEC_GRAMMAR_TRUNCATED_TOKENS.inc(len(proposal) - allowed)
                    proposal = proposal[:allowed]
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
            # A copy of a running request's prompt KV (prefix/fork.py) came from the device.
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
            metrics.PREFIX_CACHE_HITS.inc(hit.num_tokens)
            metrics.PREFIX_CACHE_HITS_BY_SOURCE.labels(hit.source.value).inc(hit.num_tokens)
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
        self._long_prefills.discard(request.request_id)
        if self.prefix is not None:
            self.prefix.retire(request, keep=True)
        self.kv.free(request.request_id)
        request.prefix_looked_up = False
        request.num_cached_device_tokens = request.num_cached_host_tokens = 0
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.num_preemptions += 1
        # Back to the queue, ahead of everything that arrived later with the same priority.
        bisect.insort(self.waiting, request, key=_queue_order)

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


def _queue_order(request: Request) -> tuple[int, float]:
    """The waiting queue's order: priority (lower first, vLLM's), then arrival."""
    return (request.priority, request.arrival_s)
