"""salon.engine.v1.EngineService: a thin gRPC edge over the engine loop.

Generate, cheapest refusal first:
    counts (no field read one by one) -> fields (ids vectorized, a constraint's size) -> queue slot (waiting +
    rendering requests below the limit) -> the constraint compiled (off the loop, time-limited, cached) ->
    render (off the loop; stops past the context or when the client goes away) ->
    kvstore lookup when the device cache has less -> submit to the step thread -> stream TokenDelta events ->
    GenerateFinal.
When the call is cancelled or its deadline passes, the request is aborted and its blocks freed at once.

Tokenize and Detokenize: counts first (messages or ids against the context, text bytes against what
the context can hold), then the fields, then the tokenizer / chat template in a worker thread, at most
MAX_TOKENIZE_CALLS at a time (the rest wait their turn), so neither ever runs on the event loop.

DeleteConversation ends the dialogue's requests and drops its KV on the step thread (device cache),
forgets its remembered reply ids, then drops it in the kvstore once its in-flight puts are done.
Only gateway identities reach these handlers (the bootstrap's AccessPolicy, salon/common/peer_identity.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
import time
import uuid
from collections.abc import Callable

import grpc

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.common.errors import DeadlineExceeded, Internal, InvalidArgument, OutOfRange, ResourceExhausted, Unavailable
from salon.common.logging import bind_request_context, get_logger
from salon.common.prefix_hash import salted_namespace_salt
from salon.engine import metrics
from salon.engine.api.model_defaults import default_sampling_message, with_model_defaults
from salon.engine.api.prompt import Character, PromptRenderer, RenderStopped, ReplyMemo
from salon.engine.api.salted_namespaces import SaltedNamespaces
from salon.engine.api.validation import (
    Limits,
    check_id_string,
    check_ids,
    check_prompt_counts,
    check_request_controls,
    check_text_size,
    forced_call_constraint,
    parse_chat_template_kwargs,
    parse_context,
    parse_dialogue,
    parse_sampling,
    resolve_max_new_tokens,
)
from salon.engine.config import EngineConfig
from salon.engine.core.engine_loop import EngineDead, EngineLoop
from salon.engine.core.output import RequestEvent
from salon.engine.grammar.compiler import GrammarCompiler
from salon.engine.grammar.constraint import Constraint
from salon.engine.grammar.matcher import RequestGrammar
from salon.engine.model.chat_renderer import ChatRenderer
from salon.engine.model.config import ModelConfig
from salon.engine.model.sampling_defaults import NEUTRAL, SamplingDefaults
from salon.engine.model.tokenizer import Tokenizer
from salon.engine.prefix.hit import PrefixHit, cacheable_prefix_tokens
from salon.engine.prefix.host_cache import HostCache
from salon.engine.request import FinishReason, Request, RequestId
from salon.engine.resident import ResidentMeter

log = get_logger(__name__)

# Tokenize / Detokenize calls doing tokenizer work at once (threads): more wait, the event loop never does.
MAX_TOKENIZE_CALLS = 2

_FINISH = {
    FinishReason.STOP_TOKEN: chat_pb2.FINISH_REASON_STOP_TOKEN,
    FinishReason.STOP_STRING: chat_pb2.FINISH_REASON_STOP_STRING,
    FinishReason.LENGTH: chat_pb2.FINISH_REASON_LENGTH,
    FinishReason.CONTEXT_FULL: chat_pb2.FINISH_REASON_CONTEXT_FULL,
    FinishReason.ABORTED: chat_pb2.FINISH_REASON_ABORTED,
}


@dataclasses.dataclass
class EngineRuntime:
    """What the servicer needs once the model is loaded."""

    loop: EngineLoop
    tokenizer: Tokenizer
    limits: Limits
    model_config: ModelConfig
    # The model's chat format (its template, or Gemma's turn format), shared by every request.
    chat: ChatRenderer
    block_size_tokens: int
    # What a request gets for the sampling fields it leaves to the model (SamplingParams.model_default_fields).
    sampling_defaults: SamplingDefaults = NEUTRAL
    # Cache namespace digest for a tenant's namespace salt; None when prefix caching is off.
    namespace_of: Callable[[str], bytes] | None = None
    # The kvstore (cross-turn cache in host memory); None when not configured.
    host_cache: HostCache | None = None
    # Widest sliding window of the model (0 if none): sets how much KV before the last message is kept.
    sliding_window_tokens: int = 0
    # Bytes of paged KV one token takes (every layer's slot, values and scales).
    kv_bytes_per_token: int = 0
    # The process's resident memory by part (salon/engine/resident.py); None in tests that build no meter.
    resident: ResidentMeter | None = None
    # Constraints (sampling.constraint) compiled for this tokenizer; None: constrained requests are refused.
    grammars: GrammarCompiler | None = None


class EngineServicer(engine_pb2_grpc.EngineServiceServicer):
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.runtime: EngineRuntime | None = None
        self.memo = ReplyMemo()
        # The cache_salt sub-namespaces each dialogue used here, erased with it (DeleteConversation).
        self.salted = SaltedNamespaces()
        # The process's health; once the model is loaded, NOT_SERVING means shutting down (draining).
        self.health = None
        # Requests between the queue check and submission (rendering, kvstore lookup): they count
        # against max_waiting_requests like queued ones, so renders in flight are bounded too.
        self._admitting = 0
        self._tokenize_slots = asyncio.Semaphore(MAX_TOKENIZE_CALLS)

    def _ready(self) -> EngineRuntime:
        if self.runtime is None:
            raise Unavailable("the engine is still loading its model")
        return self.runtime

    # ---- Generate --------------------------------------------------------------------------------
    def _admission_slot(self) -> None:
        """RESOURCE_EXHAUSTED when the queue (waiting + being admitted) is full; else take a slot."""
        rt = self._ready()
        limit = self.config.scheduler.max_waiting_requests
        if rt.loop.num_waiting + self._admitting >= limit:
            metrics.REJECTED.inc()
            raise ResourceExhausted(
                f"engine queue is full ({limit} requests waiting); retry later", retry_after_ms=1000
            )
        self._admitting += 1

    def _parse(self, request, rt: EngineRuntime):
        """(sampling, resumed ids, parsed context): every check that costs no rendering."""
        limits = rt.limits
        check_id_string("request_id", request.request_id, required=False)
        check_id_string("conversation_id", request.conversation_id, required=False)
        check_id_string("namespace_salt", request.namespace_salt, required=False)
        if "\x00" in request.namespace_salt:
            raise InvalidArgument("namespace_salt: must not hold NUL (it separates a cache_salt's sub-namespace)")
        check_request_controls(request)
        check_prompt_counts(request, limits)
        sampling = parse_sampling(with_model_defaults(request.sampling, rt.sampling_defaults), limits)
        resumed = check_ids("resume_token_ids", request.resume_token_ids, limits.vocab_size, limits.max_context_tokens)
        parsed = parse_context(request, limits)
        forced = forced_call_constraint(request, parsed.tools, sampling)
        if forced is not None:
            sampling = dataclasses.replace(sampling, constraint=forced)
        template_kwargs = parse_chat_template_kwargs(request.chat_template_kwargs_json, rt.chat.reserved_variables)
        return sampling, resumed, parsed, template_kwargs

    async def _build_request(
        self, request, context, rt: EngineRuntime, sampling, resumed, parsed, template_kwargs
    ) -> Request:
        arrival = time.monotonic()
        limits = rt.limits
        if parsed.prompt_token_ids is not None:
            prompt = parsed.prompt_token_ids
            last_message_start = len(prompt)
        elif parsed.text is not None:
            prompt = await asyncio.to_thread(rt.tokenizer.encode, parsed.text, True, False)
            last_message_start = len(prompt)
        else:
            prompt, last_message_start = await self._render(request, parsed, rt, template_kwargs)
        keep = request.sampling.truncate_prompt_tokens
        if keep and len(prompt) > keep:  # vLLM's truncate_prompt_tokens: the last `keep` tokens
            last_message_start = max(0, last_message_start - (len(prompt) - keep))
            prompt = prompt[-keep:]
        max_new = resolve_max_new_tokens(sampling.max_new_tokens, len(prompt), len(resumed), limits)
        if sampling.min_tokens > max_new:
            raise InvalidArgument(f"sampling.min_tokens: {sampling.min_tokens} is more than max_new_tokens {max_new}")
        # A reply ends at the file's EOS ids and the template's end-of-turn marker (unless ignore_eos), and at
        # the request's own; min_tokens masks all of them.
        model_stops = set(rt.model_config.eos_token_ids) | set(rt.chat.stop_token_ids)
        stops = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else model_stops)
        mask_ids = tuple(sorted(model_stops | set(sampling.stop_token_ids))) if sampling.min_tokens else ()
        sampling = dataclasses.replace(sampling, max_new_tokens=max_new, min_tokens_mask_ids=mask_ids)
        if not rt.loop.fits(len(prompt) + max_new):
            raise ResourceExhausted(
                f"prompt: {len(prompt)} tokens + max_new_tokens {max_new} need more KV memory than this engine has"
            )
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        req = Request(
            request_id=RequestId(request.request_id or f"eng-{uuid.uuid4().hex}"),
            prompt_token_ids=prompt,
            sampling=sampling,
            stop_token_ids=frozenset(stops),
            max_context_tokens=limits.max_context_tokens,
            arrival_s=arrival,
            deadline_s=deadline,
            namespace_salt=request.namespace_salt,
            priority=request.priority,
        )
        req.output_token_ids.extend(resumed)
        req.num_resumed_tokens = len(resumed)
        req.conversation_id = request.conversation_id
        if rt.namespace_of is not None and request.cache_salt:
            # A sub-namespace of the tenant's that only this engine knows: device cache only (Request.host_cacheable).
            req.namespace = rt.namespace_of(salted_namespace_salt(request.namespace_salt, request.cache_salt))
            req.host_cacheable = False
            self.salted.note(request.namespace_salt, request.conversation_id, req.namespace)
        elif rt.namespace_of is not None:
            req.namespace = rt.namespace_of(request.namespace_salt)
            if rt.host_cache is not None:
                rt.host_cache.note_grant(req.namespace, request.namespace_salt, request.namespace_grant)
        if req.namespace is not None and rt.sliding_window_tokens:
            # Keep the window before the last message: a regeneration or edit of it reuses that KV.
            req.retain_local_from = max(0, last_message_start - rt.sliding_window_tokens - rt.block_size_tokens)
        return req

    async def _render(self, request, parsed, rt: EngineRuntime, template_kwargs: dict | None) -> tuple[list[int], int]:
        """Tokenize the dialogue off the event loop; stops early past the context or on cancellation."""
        salt, conversation = request.namespace_salt, request.conversation_id
        renderer = PromptRenderer(rt.chat, lambda text: self.memo.get(salt, conversation, text))
        stop = threading.Event()
        context_tokens = rt.limits.max_context_tokens
        try:
            rendered = await asyncio.to_thread(
                renderer.render_prompt,
                parsed.character,
                parsed.messages,
                stop,
                context_tokens,
                template_kwargs,
                parsed.tools,
            )
        except asyncio.CancelledError:
            stop.set()  # the client went away: the worker thread stops at the next message
            raise
        except RenderStopped as exc:
            raise OutOfRange(
                f"prompt: more than {exc.num_tokens} tokens leave no room to generate in the "
                f"context of {context_tokens} tokens"
            ) from None
        return rendered.token_ids, rendered.last_message_start

    @staticmethod
    async def _compile(constraint: Constraint | None, rt: EngineRuntime) -> RequestGrammar | None:
        """The request's grammar, compiled off the loop (or from the cache) before it is queued."""
        if constraint is None:
            return None
        if rt.grammars is None:
            raise InvalidArgument("sampling.constraint: this engine does not serve constrained decoding")
        try:
            return await rt.grammars.matcher(constraint)
        except InvalidArgument as exc:
            raise InvalidArgument(f"sampling.constraint.{exc.message}") from None

    async def _lookup_host(self, req: Request, rt: EngineRuntime) -> PrefixHit | None:
        """Fetch the kvstore's usable prefix when it beats what the engine's own cache holds."""
        if rt.host_cache is None or req.namespace is None or not req.host_cacheable:
            return None
        max_tokens = cacheable_prefix_tokens(req.num_tokens, rt.block_size_tokens)
        device_tokens = rt.loop.probe_prefix(req)
        return await rt.host_cache.lookup(
            req.namespace, req.token_slice(0, req.num_tokens), max_tokens, min_tokens=device_tokens
        )

    async def Generate(self, request, context):
        rt = self._ready()
        if request.request_id:  # the gateway's id: log lines of every service carry the same one
            bind_request_context(request_id=request.request_id)
        sampling, resumed, parsed, template_kwargs = self._parse(request, rt)
        if rt.loop.dead is not None:
            raise Unavailable("the engine is restarting; retry on another engine")
        self._admission_slot()
        try:
            grammar = await self._compile(sampling.constraint, rt)
            req = await self._build_request(request, context, rt, sampling, resumed, parsed, template_kwargs)
            req.grammar = grammar
            if rt.loop.is_active(req.request_id):
                raise ResourceExhausted(f"request_id: {req.request_id!r} is already running on this engine")
            host_hit = await self._lookup_host(req, rt)
            try:
                events = rt.loop.submit(req, host_hit, prefill_from=RequestId(request.prefill_from_request_id) or None)
            except EngineDead:
                raise Unavailable("the engine is restarting; retry on another engine") from None
        finally:
            self._admitting -= 1
        with_bytes = req.sampling.return_logprobs or req.sampling.num_top_logprobs > 0
        finished = False
        generated: list[int] = []
        text_parts: list[str] = []
        try:
            while True:
                event: RequestEvent = await events.get()
                generated.extend(event.token_ids)
                text_parts.append(event.text)
                if event.token_ids or event.text:
                    yield engine_pb2.GenerateResponse(delta=self._delta(event, rt.tokenizer, with_bytes))
                if event.finish_reason is None:
                    continue
                finished = True
                if event.finish_reason is FinishReason.ERROR:
                    if rt.loop.dead is not None:  # the gateway resumes the reply on another engine
                        raise Unavailable(f"request {req.request_id}: the engine is restarting")
                    raise Internal(f"request {req.request_id} failed: {event.error}")
                if event.error == "deadline exceeded":
                    raise DeadlineExceeded(f"request {req.request_id}: deadline exceeded")
                self._remember_reply(req, event, generated, "".join(text_parts))
                yield engine_pb2.GenerateResponse(final=self._final(req, event))
                return
        finally:
            if not finished:
                rt.loop.abort(req.request_id)

    @staticmethod
    def _delta(event: RequestEvent, tokenizer: Tokenizer, with_bytes: bool) -> chat_pb2.TokenDelta:
        delta = chat_pb2.TokenDelta(text=event.text, token_ids=event.token_ids, logprobs=event.logprobs)
        if with_bytes:
            delta.token_bytes.extend(_piece_bytes(tokenizer, t) for t in event.token_ids)
        for position in event.top_logprobs:
            delta.top_logprobs.add(
                candidates=[
                    chat_pb2.TokenLogprob(token_id=t, logprob=lp, token_bytes=_piece_bytes(tokenizer, t))
                    for t, lp in position
                ]
            )
        return delta

    def _remember_reply(self, req: Request, event: RequestEvent, generated: list[int], text: str) -> None:
        """Keep the ids of a whole reply so next turn's rendering of its text reproduces them."""
        if event.finish_reason not in (FinishReason.STOP_TOKEN, FinishReason.LENGTH) or req.num_resumed_tokens:
            return
        p = req.sampling
        if p.ignore_eos or not p.skip_special_tokens or p.include_stop_str_in_output:
            return  # its text is not the reply's body as the next turn carries it
        body = generated[:-1] if event.finish_reason is FinishReason.STOP_TOKEN else generated
        if text:
            self.memo.put(req.namespace_salt, req.conversation_id, text, body)

    def _final(self, req: Request, event: RequestEvent) -> chat_pb2.GenerateFinal:
        st = event.final
        return chat_pb2.GenerateFinal(
            finish_reason=_FINISH[event.finish_reason],
            usage=chat_pb2.Usage(
                prompt_tokens=st.prompt_tokens,
                cached_tokens=chat_pb2.CachedTokens(device=st.cached_tokens_device, host=st.cached_tokens_host),
                generated_tokens=st.generated_tokens,
            ),
            timings=chat_pb2.Timings(
                queue_ms=st.queue_ms, ttft_ms=st.ttft_ms, total_ms=st.total_ms, itl_ms_mean=st.itl_ms_mean
            ),
            engine_id=self.config.engine_id,
            request_id=req.request_id,
        )

    # ---- erasure --------------------------------------------------------------------------------
    async def DeleteConversation(self, request, context):
        rt = self._ready()
        check_id_string("conversation_id", request.conversation_id, required=True)
        check_id_string("namespace_salt", request.namespace_salt, required=False)
        namespace = rt.namespace_of(request.namespace_salt) if rt.namespace_of is not None else None
        try:
            aborted, device_blocks = await rt.loop.purge(namespace, request.conversation_id)
            for salted in self.salted.take(request.namespace_salt, request.conversation_id):
                more_aborted, more_blocks = await rt.loop.purge(salted, request.conversation_id)
                aborted, device_blocks = aborted + more_aborted, device_blocks + more_blocks
        except EngineDead:
            raise Unavailable("the engine is restarting; retry") from None
        self.memo.drop_conversation(request.namespace_salt, request.conversation_id)
        host_blocks = 0
        if rt.host_cache is not None and namespace is not None:
            rt.host_cache.note_grant(namespace, request.namespace_salt, request.namespace_grant)
            dropped = await rt.host_cache.drop_conversation(namespace, request.conversation_id)
            if dropped is None:
                raise Unavailable("conversation_id: the kvstore did not confirm the erasure; retry")
            host_blocks = dropped
        log.info(
            "conversation_deleted",
            conversation_id=request.conversation_id,
            aborted_requests=aborted,
            device_blocks=device_blocks,
            host_blocks=host_blocks,
        )
        return engine_pb2.DeleteConversationResponse(
            aborted_requests=aborted, device_blocks_dropped=device_blocks, host_blocks_dropped=host_blocks
        )

    # ---- other RPCs ------------------------------------------------------------------------------
    async def Abort(self, request, context):
        rt = self._ready()
        return engine_pb2.AbortResponse(aborted=rt.loop.abort(request.request_id))

    def _load_report(self) -> engine_pb2.LoadReport:
        rt = self.runtime
        if rt is None:
            return engine_pb2.LoadReport(
                engine_id=self.config.engine_id, max_waiting_requests=self.config.scheduler.max_waiting_requests
            )
        snap = rt.loop.load
        resident = None
        if rt.resident is not None:
            r = rt.resident.measure()
            resident = chat_pb2.ResidentBytes(
                total_bytes=r.total_bytes,
                weights_bytes=r.weights_bytes,
                kv_cache_bytes=r.kv_cache_bytes,
                other_bytes=r.other_bytes,
                arena_bytes=r.arena_bytes,
            )
        return engine_pb2.LoadReport(
            model_id=rt.model_config.model_id,
            resident=resident,
            engine_id=self.config.engine_id,
            running_requests=snap.running_requests,
            waiting_requests=rt.loop.num_waiting,
            max_waiting_requests=self.config.scheduler.max_waiting_requests,
            free_kv_blocks=snap.free_kv_blocks,
            cached_kv_blocks=snap.cached_kv_blocks,
            total_kv_blocks=snap.total_kv_blocks,
            decode_tokens_per_s=snap.decode_tokens_per_s,
            draining=self.health is not None and not self.health.serving,
        )

    async def GetLoad(self, request, context):
        return engine_pb2.GetLoadResponse(load=self._load_report())

    async def WatchLoad(self, request, context):
        interval_s = (request.interval_ms or 500) / 1000.0
        while True:
            yield engine_pb2.WatchLoadResponse(load=self._load_report())
            await asyncio.sleep(interval_s)

    async def Tokenize(self, request, context):
        rt = self._ready()
        which = request.WhichOneof("input")
        context_tokens = rt.limits.max_context_tokens
        if which == "text":
            check_text_size("text", request.text, rt.limits)
            special = request.add_special_tokens
            work = functools.partial(rt.tokenizer.encode, request.text, special, special)
        elif which == "dialogue":
            num_messages = len(request.dialogue.messages)
            if num_messages >= context_tokens:
                raise OutOfRange(
                    f"dialogue.messages: {num_messages} messages cannot fit in the context of {context_tokens} tokens"
                )
            messages = parse_dialogue(request.dialogue, rt.limits, request.character)
            character = (
                Character(request.character.name, request.character.definition)
                if request.HasField("character")
                else None
            )
            # Tokenize names no conversation, so no remembered reply ids apply: replies are tokenized as text.
            work = functools.partial(PromptRenderer(rt.chat).render, character, messages)
        else:
            raise InvalidArgument("input: one of text or dialogue is required")
        async with self._tokenize_slots:
            ids = await asyncio.to_thread(work)
        return engine_pb2.TokenizeResponse(token_ids=ids, max_context_tokens=context_tokens)

    async def Detokenize(self, request, context):
        rt = self._ready()
        ids = check_ids("token_ids", request.token_ids, rt.limits.vocab_size, rt.limits.max_context_tokens)
        async with self._tokenize_slots:
            text = await asyncio.to_thread(rt.tokenizer.decode, ids)
        return engine_pb2.DetokenizeResponse(text=text)

    async def GetModelInfo(self, request, context):
        rt = self._ready()
        cfg = rt.model_config
        return engine_pb2.GetModelInfoResponse(
            model=chat_pb2.ModelInfo(
                model_id=cfg.model_id,
                max_context_tokens=rt.limits.max_context_tokens,
                vocab_size=cfg.vocab_size,
                eos_token_ids=list(rt.chat.stop_token_ids),
                bos_token_id=cfg.bos_token_id,
                kv_block_size_tokens=rt.block_size_tokens,
                architecture=cfg.architecture,
                kv_bytes_per_token=rt.kv_bytes_per_token,
                has_chat_template=rt.chat.has_own_template,
                default_sampling=default_sampling_message(rt.sampling_defaults),
            )
        )


def _piece_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    return b"" if tokenizer.is_special(token_id) else tokenizer.token_bytes(token_id)


def add_to_server(servicer: EngineServicer, server: grpc.aio.Server) -> str:
    engine_pb2_grpc.add_EngineServiceServicer_to_server(servicer, server)
    return engine_pb2.DESCRIPTOR.services_by_name["EngineService"].full_name
