"""Turning a request's sampled tokens into stream events: text deltas, stop checks, final stats.

Text is held back while it could still be the beginning of a stop string (at most the longest stop
string minus one character), so a stop string is never streamed; the stop string itself (unless
include_stop_str_in_output) and anything after it are dropped. Before min_tokens tokens, stop strings
are not looked for (and stop tokens cannot be sampled: the sampler masks them). Stop tokens (EOS, end
of turn, the request's own; not EOS and end of turn with ignore_eos) end the reply and are part of its
token ids; special tokens are not part of its text unless skip_special_tokens is false.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from salon.engine.model.tokenizer import IncrementalDetokenizer
from salon.engine.request import FinishReason, Request


@dataclass(frozen=True)
class FinalStats:
    prompt_tokens: int
    generated_tokens: int
    cached_tokens_device: int
    cached_tokens_host: int
    queue_ms: float
    ttft_ms: float
    total_ms: float
    itl_ms_mean: float
    num_preemptions: int


@dataclass(frozen=True)
class RequestEvent:
    """What one step produced for one request (a delta, and/or the end of the stream)."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason | None = None
    final: FinalStats | None = None
    error: str | None = None
    # Per token of token_ids: (token id, log-prob) of the most likely tokens (SamplingParams.num_top_logprobs).
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    # Seconds since the request's previous token was sampled here (None for its first token).
    inter_token_s: float | None = None


class OutputState:
    def __init__(self, request: Request, tokenizer) -> None:
        self.request = request
        p = request.sampling
        self._detok = IncrementalDetokenizer(tokenizer, p.skip_special_tokens, p.spaces_between_special_tokens)
        self._text = ""
        self._emitted = 0
        self._hold = max((len(s) for s in request.sampling.stop_strings), default=1) - 1
        # Length of the text of the tokens before min_tokens was reached: stop strings are not looked for in it.
        self._min_tokens_text = 0
        # Resumed tokens were streamed by another engine: feed them, emit nothing for them.
        for t in request.output_token_ids:
            self._text += self._detok.feed(t)
        self._emitted = len(self._text)

    @property
    def text(self) -> str:
        return self._text

    def on_token(self, token_id: int) -> tuple[str, FinishReason | None]:
        """Record a sampled token (already appended to the request); return (text delta, finish)."""
        r = self.request
        if token_id in r.stop_token_ids:
            return self._flush(), FinishReason.STOP_TOKEN
        before = len(self._text)
        self._text += self._detok.feed(token_id)
        # Stop strings match only in text of tokens past min_tokens (vLLM): the search starts no earlier.
        if r.num_output_tokens >= r.sampling.min_tokens:
            for stop in r.sampling.stop_strings:
                at = self._text.find(stop, max(self._min_tokens_text, before - len(stop) + 1))
                if at >= 0:
                    end = at + len(stop) if r.sampling.include_stop_str_in_output else at
                    self._text = self._text[:end]
                    return self._take(len(self._text)), FinishReason.STOP_STRING
        else:
            self._min_tokens_text = len(self._text)
        if r.num_output_tokens >= r.sampling.max_new_tokens:
            return self._flush(), FinishReason.LENGTH
        if r.num_tokens >= r.max_context_tokens:
            return self._flush(), FinishReason.CONTEXT_FULL
        return self._take(max(self._emitted, len(self._text) - self._hold)), None

    def _flush(self) -> str:
        self._text += self._detok.flush()
        return self._take(len(self._text))

    def _take(self, upto: int) -> str:
        delta = self._text[self._emitted : upto]
        self._emitted = max(self._emitted, upto)
        return delta


def final_stats(request: Request, now_s: float | None = None) -> FinalStats:
    now_s = time.monotonic() if now_s is None else now_s
    arrival = request.arrival_s
    first_sched = request.first_scheduled_s if request.first_scheduled_s is not None else now_s
    first_tok, last_tok = request.first_token_s, request.last_token_s
    # Resumed tokens (failover) belong to the reply but were not generated here: no ITL for them.
    new_tokens = request.num_output_tokens - request.num_resumed_tokens
    itl = 0.0
    if first_tok is not None and last_tok is not None and new_tokens > 1:
        itl = (last_tok - first_tok) * 1000.0 / (new_tokens - 1)
    return FinalStats(
        prompt_tokens=request.num_prompt_tokens,
        generated_tokens=request.num_output_tokens,
        cached_tokens_device=request.num_cached_device_tokens,
        cached_tokens_host=request.num_cached_host_tokens,
        queue_ms=(first_sched - arrival) * 1000.0,
        ttft_ms=((first_tok if first_tok is not None else now_s) - arrival) * 1000.0,
        total_ms=((last_tok if last_tok is not None else now_s) - arrival) * 1000.0,
        itl_ms_mean=itl,
        num_preemptions=request.num_preemptions,
    )
