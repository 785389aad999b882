"""The engine core: one synchronous step loop over scheduler, model runner and output states.

    step():  schedule -> write fetched host KV -> run the model -> record computed tokens
             -> append sampled tokens -> stop checks / text deltas -> retire finished requests

Commands (add, abort, step) and queries (probe_prefix, load, fits, expired) are all the engine loop
(engine_loop.py) and the servicer need; nothing outside reaches into the scheduler or the caches.
Prefix caching (when enabled) is prefix/policy.py: the scheduler starts an admitted request from
the longer of its device hit and the host hit it was submitted with; a finished or preempted
request's blocks go to the device cache, and their KV to the kvstore (`host_sink`).

Not thread-safe: exactly one thread (engine_loop.EngineLoop) calls the commands; `probe_prefix`
may be called from any thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from salon.engine.batch import SchedulerOutput
from salon.engine.config import SchedulerConfig
from salon.engine.core.output import OutputState, RequestEvent, final_stats
from salon.engine.core.scheduler import Scheduler
from salon.engine.kv.kv_cache import KVCache
from salon.engine.kv.kv_cache_manager import KVCacheManager
from salon.engine.kv.kv_layout import KVCacheLayout, plan_layout
from salon.engine.kv.kv_transfer import GLOBAL, LOCAL, unpack_blocks
from salon.engine.prefix.fork import fork_hit
from salon.engine.prefix.hit import PrefixHit, better_hit
from salon.engine.prefix.host_cache import HostPut
from salon.engine.prefix.policy import PrefixCaching
from salon.engine.request import FinishReason, Request, RequestId, SamplingParams
from salon.engine.worker.model_runner import ModelRunner
from salon.engine.worker.sampler import advance_generator
from salon.kernels.backend import select_ops


@dataclass(frozen=True)
class StepStats:
    num_batched_tokens: int
    num_sequences: int
    num_sampled: int
    duration_s: float
    num_preempted: int
    # Speculative decoding in this step: draft tokens verified, and those accepted.
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0


@dataclass(frozen=True)
class LoadSnapshot:
    running_requests: int
    waiting_requests: int
    free_kv_blocks: int
    cached_kv_blocks: int
    total_kv_blocks: int
    decode_tokens_per_s: float
    num_preemptions: int


class EngineCore:
    def __init__(
        self,
        model,
        tokenizer,
        scheduler_config: SchedulerConfig,
        block_size_tokens: int,
        kv_cache_bytes: int,
        device: str = "cpu",
        prefix_caching: bool = True,
        kv_dtype: str = "int8",
        kernels: str = "auto",
        cuda_graphs: bool = True,
        max_context_tokens: int | None = None,
    ) -> None:
        """cuda_graphs: decode steps replayed from CUDA graphs (effective on CUDA with the Triton kernels only:
        worker/cuda_graphs.py); max_context_tokens: the engine's context limit (default: the model's)."""
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        self.layout: KVCacheLayout = plan_layout(self.config, block_size_tokens, kv_cache_bytes, kv_dtype)
        self.kv_cache = KVCache(self.layout, device)
        self.kv_manager = KVCacheManager(self.layout)
        self.prefix = PrefixCaching(self.kv_manager, self.kv_cache) if prefix_caching else None
        self.scheduler = Scheduler(scheduler_config, self.kv_manager, self.prefix)
        ops = select_ops(device, kernels)
        # The kernels that compute the KV, their family and its build where builds differ in bits ("cpu-avx512"):
        # part of the cache namespace (kv_transfer.layout_tag), so engines never share KV of other bits.
        self.kernel_family = f"{ops.name}-{ops.build}" if ops.build else ops.name
        self.runner = ModelRunner(
            model,
            self.kv_cache,
            ops,
            device,
            max_num_tokens=scheduler_config.max_num_batched_tokens,
            max_num_running=scheduler_config.max_num_running,
            max_context_tokens=max_context_tokens,
            cuda_graphs=cuda_graphs,
        )
        self._outputs: dict[str, OutputState] = {}
        self.last_step: StepStats | None = None
        # The requests of the step under way (set once it is scheduled): what a step error fails.
        self.in_step: list[RequestId] = []
        # Speculative decoding so far: draft tokens verified, and those accepted (became output tokens).
        self.num_draft_tokens = 0
        self.num_accepted_draft_tokens = 0

    # ---- queries -------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def has_request(self, request_id: str) -> bool:
        return request_id in self._outputs

    def fits(self, num_tokens: int) -> bool:
        """Whether one request of num_tokens tokens (prompt + max new tokens) fits in the KV cache at all."""
        chunk = self.scheduler.config.max_num_batched_tokens
        return self.kv_manager.max_blocks_for_tokens(num_tokens, chunk) <= self.layout.num_blocks

    def probe_prefix(self, request: Request) -> int:
        """Tokens of the request's context the device cache could give it now (any thread; a hint that
        decides whether the kvstore is worth asking)."""
        return 0 if self.prefix is None else self.prefix.device_hit_tokens(request)

    def expired(self, now_s: float) -> list[RequestId]:
        """Queued or running requests whose deadline has passed."""
        requests = list(self.scheduler.waiting) + list(self.scheduler.running)
        return [r.request_id for r in requests if r.deadline_s is not None and now_s > r.deadline_s]

    def load(self, decode_tokens_per_s: float = 0.0) -> LoadSnapshot:
        return LoadSnapshot(
            running_requests=self.scheduler.num_running,
            waiting_requests=self.scheduler.num_waiting,
            free_kv_blocks=self.kv_manager.num_free_blocks,
            cached_kv_blocks=self.kv_manager.num_reclaimable_blocks,
            total_kv_blocks=self.layout.num_blocks,
            decode_tokens_per_s=decode_tokens_per_s,
            num_preemptions=self.scheduler.num_preemptions,
        )

    # ---- commands ------------------------------------------------------------------------------
    def set_host_sink(self, sink: Callable[[HostPut], None] | None) -> None:
        """Where the KV of retired requests goes, for the kvstore (no-op without prefix caching)."""
        if self.prefix is not None:
            self.prefix.host_sink = sink

    def add(self, request: Request, host_hit: PrefixHit | None = None, prefill_from: RequestId | None = None) -> None:
        """Queue a request; host_hit: KV fetched from the kvstore for its context (prefix/host_cache.py);
        prefill_from: a running request whose computed prompt this one repeats (another choice of the
        same completion): the KV of the shared whole blocks is copied from it (prefix/fork.py)."""
        if request.request_id in self._outputs:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if prefill_from is not None and self.prefix is not None and request.namespace is not None:
            parent = self._outputs.get(prefill_from)
            if parent is not None and self.kv_manager.has_blocks(prefill_from):
                fork = fork_hit(self.kv_cache, self.kv_manager.block_tables(prefill_from), parent.request, request)
                host_hit = better_hit(fork, host_hit)
        # The seeded sampler skips the draws of the tokens another engine already streamed; the grammar
        # moves past them.
        for _ in range(request.num_resumed_tokens):
            advance_generator(request.generator)
        if request.grammar is not None:
            for token_id in request.output_token_ids[request.grammar.num_accepted_tokens :]:
                request.grammar.accept(token_id)
        self._outputs[request.request_id] = OutputState(request, self.tokenizer)
        self.scheduler.add(request, host_hit if self.prefix is not None else None)

    def abort(
        self, request_id: str, reason: FinishReason = FinishReason.ABORTED, error: str | None = None
    ) -> RequestEvent | None:
        """End a request from outside the step (abort, deadline, error); frees its blocks at once."""
        state = self._outputs.pop(request_id, None)
        if state is None:
            return None
        self._retire(state.request, keep=reason is not FinishReason.ERROR)
        return RequestEvent(request_id, [], [], "", reason, final_stats(state.request), error)

    def fail_all(self, error: str) -> list[RequestEvent]:
        return self.fail(list(self._outputs), error)

    def fail(self, request_ids: list[RequestId], error: str) -> list[RequestEvent]:
        """End these requests with FinishReason.ERROR (their KV is freed, not cached)."""
        return [e for rid in request_ids if (e := self.abort(rid, FinishReason.ERROR, error))]

    def purge_conversation(self, namespace: bytes | None, conversation_id: str) -> tuple[list[RequestEvent], int]:
        """Erase a dialogue: end its requests without keeping their KV, and drop its device-cache
        entries. Returns (the ended requests' events, device blocks freed)."""
        events = []
        for request_id, state in list(self._outputs.items()):
            request = state.request
            if request.conversation_id == conversation_id and request.namespace == namespace:
                self._outputs.pop(request_id)
                self._retire(request, keep=False)
                events.append(
                    RequestEvent(
                        request_id, [], [], "", FinishReason.ABORTED, final_stats(request), "conversation deleted"
                    )
                )
        freed = 0
        if self.prefix is not None and namespace is not None:
            freed = self.prefix.device.drop_conversation(namespace, conversation_id)
        return events, freed

    def step(self) -> list[RequestEvent]:
        t0 = time.monotonic()
        self.in_step = []
        output = self.scheduler.schedule()
        if output.is_empty:
            return []
        self.in_step = [c.request.request_id for c in output.chunks]
        now = time.monotonic()
        for chunk in output.chunks:
            if chunk.request.first_scheduled_s is None:
                chunk.request.first_scheduled_s = now
        output, events = self._write_host_kv(output)
        if output.is_empty:
            return events
        sampled = self.runner.execute(output)
        self.scheduler.on_computed(output)
        now = time.monotonic()
        sampled_chunks = [c for c in output.chunks if c.needs_sample]
        num_sampled = 0
        drafts_before = (self.num_draft_tokens, self.num_accepted_draft_tokens)
        for chunk, produced in zip(sampled_chunks, sampled):
            request = chunk.request
            state = self._outputs[request.request_id]
            inter_token_s = None if request.last_token_s is None else now - request.last_token_s
            if request.first_token_s is None:
                request.first_token_s = now
            request.last_token_s = now
            token_ids: list[int] = []
            texts: list[str] = []
            finish = error = None
            for token in produced:  # one token, or accepted drafts and one more: each checked like a decode's
                request.output_token_ids.append(token.token_id)
                token_ids.append(token.token_id)
                text, finish = state.on_token(token.token_id)
                texts.append(text)
                if request.grammar is not None:
                    if not request.grammar.accept(token.token_id):
                        finish, error = FinishReason.ERROR, f"token {token.token_id} is outside the constraint"
                    elif finish is None and request.grammar.is_terminated:
                        finish = FinishReason.STOP_TOKEN  # a finished grammar ends the reply
                if finish is not None:
                    break
            kept = produced[: len(token_ids)]
            num_sampled += len(kept)
            if chunk.num_draft_tokens:
                self.num_draft_tokens += chunk.num_draft_tokens
                self.num_accepted_draft_tokens += sum(1 for t, d in zip(kept, chunk.draft_token_ids) if t.token_id == d)
                self.scheduler.on_verified(chunk, len(kept))
            final = None
            if finish is not None:
                self._outputs.pop(request.request_id)
                self._retire(request, keep=error is None)
                final = final_stats(request, now)
            logprobs = [t.logprob for t in kept if t.logprob is not None]
            top = [t.top_logprobs for t in kept if t.top_logprobs]
            events.append(
                RequestEvent(
                    request.request_id,
                    token_ids,
                    logprobs,
                    "".join(texts),
                    finish,
                    final,
                    error=error,
                    top_logprobs=top,
                    inter_token_s=inter_token_s,
                )
            )
        self.last_step = StepStats(
            output.num_batched_tokens,
            len(output.chunks),
            num_sampled,
            time.monotonic() - t0,
            len(output.preempted),
            self.num_draft_tokens - drafts_before[0],
            self.num_accepted_draft_tokens - drafts_before[1],
        )
        self.in_step = []
        return events

    def _retire(self, request: Request, keep: bool) -> None:
        if self.prefix is not None:
            self.prefix.retire(request, keep)
        self.scheduler.remove(request)

    def _write_host_kv(self, output: SchedulerOutput) -> tuple[SchedulerOutput, list[RequestEvent]]:
        """Write KV fetched from the kvstore into the blocks just allocated for it. A request whose
        fetched KV does not fit its blocks fails alone (ERROR); the rest of the step goes on."""
        bs = self.layout.block_size_tokens
        failed: dict[RequestId, str] = {}
        for chunk in output.chunks:
            host = chunk.host_kv
            if host is None:
                continue
            num_blocks = chunk.start_position // bs
            try:
                unpack_blocks(self.kv_cache, chunk.block_tables, range(num_blocks), GLOBAL, host.global_kv)
                if host.local_kv.shape[0]:
                    unpack_blocks(
                        self.kv_cache,
                        chunk.block_tables,
                        range(host.local_first_block, num_blocks),
                        LOCAL,
                        host.local_kv,
                    )
            except Exception as exc:  # noqa: BLE001 - the kvstore's bytes are not trusted to be well formed
                failed[chunk.request.request_id] = f"the kvstore's KV for this request is malformed ({exc})"
        if not failed:
            return output, []
        events = [e for rid, error in failed.items() if (e := self.abort(rid, FinishReason.ERROR, error))]
        kept = SchedulerOutput([c for c in output.chunks if c.request.request_id not in failed], output.preempted)
        return kept, events


def warmup(core: EngineCore, prompt_len: int = 24, new_tokens: int = 4) -> None:
    """Run one short greedy request to the end (first-call costs paid before SERVING)."""
    request = Request(
        request_id=RequestId("__warmup__"),
        prompt_token_ids=[core.config.bos_token_id]
        + [(1000 + i) % core.config.vocab_size for i in range(prompt_len - 1)],
        sampling=SamplingParams(max_new_tokens=new_tokens),
        stop_token_ids=frozenset(),
        max_context_tokens=core.config.max_context_tokens,
    )
    core.add(request)
    with torch.inference_mode():
        while core.has_request(request.request_id):
            core.step()
