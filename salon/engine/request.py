"""A request's state inside the engine: tokens, progress, sampling, timings.

There is no prefill or decode phase: each request has `num_computed_tokens` catching up with
`num_tokens` (prompt + output so far). A prefill is many tokens computed in one or more steps; a
decode is one. Preemption (recompute) sets num_computed_tokens back to 0; the output tokens stay and
are recomputed as part of the prompt.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NewType

import torch

from salon.common.prefix_hash import ROOT_PARENT, BlockHash, block_hashes
from salon.engine.grammar.constraint import Constraint

if TYPE_CHECKING:
    from salon.engine.grammar.matcher import RequestGrammar

RequestId = NewType("RequestId", str)


class FinishReason(enum.Enum):
    STOP_TOKEN = "stop_token"
    STOP_STRING = "stop_string"
    LENGTH = "length"
    CONTEXT_FULL = "context_full"
    ABORTED = "aborted"
    ERROR = "error"


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# A logit bias at or below this bans its token (OpenAI: -100 should result in a ban).
BAN_BIAS = -100.0


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0  # 1 = no limit
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    return_logprobs: bool = False
    # With each token, the log-probs of this many most likely tokens (0: none), from the model's logits.
    num_top_logprobs: int = 0
    # Penalties (vLLM's semantics, applied to the logits before anything else, greedy rows included):
    # repetition: a token seen in the prompt or the output has its logit divided by it (if > 0) or
    # multiplied by it (if <= 0); 1 = none. frequency / presence: subtracted once per occurrence / once
    # for any occurrence of the token in the output so far; 0 = none.
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # Keep only tokens whose probability (after temperature) is at least min_p times the top one's; 0 = none.
    min_p: float = 0.0
    # (token id, bias) pairs, ids ascending, added to the logits before anything else (OpenAI's logit_bias;
    # a bias of BAN_BIAS or below makes the logit -inf). Log-probs are those of the biased logits.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # Until the output has min_tokens tokens, min_tokens_mask_ids (the request's stop tokens, EOS included
    # even with ignore_eos) have logit -inf and stop strings are not matched (vLLM's min_tokens).
    min_tokens: int = 0
    min_tokens_mask_ids: tuple[int, ...] = ()
    # Generate past the model's EOS and end-of-turn ids (they are left out of Request.stop_token_ids).
    ignore_eos: bool = False
    # Detokenization (vLLM's): special tokens left out of the text, or shown, separated by spaces.
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # Keep the matched stop string at the end of the text.
    include_stop_str_in_output: bool = False
    # Constrained decoding: the reply's text stays inside this constraint (grammar/); None = free text.
    constraint: Constraint | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def has_logit_masks(self) -> bool:
        """Whether a row's logits change before anything else: a logit bias, or a min_tokens mask."""
        return bool(self.logit_bias) or (self.min_tokens > 0 and bool(self.min_tokens_mask_ids))

    def masked_token_ids(self, num_output_tokens: int) -> tuple[int, ...]:
        """Ids whose logit is -inf at an output position: banned by the bias, or stop tokens before min_tokens."""
        banned = tuple(t for t, b in self.logit_bias if b <= BAN_BIAS)
        if num_output_tokens < self.min_tokens:
            return banned + self.min_tokens_mask_ids
        return banned


@dataclass(eq=False)  # identity: requests are compared and removed by object, never by value
class Request:
    request_id: RequestId
    prompt_token_ids: list[int]
    sampling: SamplingParams
    # Stop tokens (the model's EOS ids + the request's own).
    stop_token_ids: frozenset[int]
    max_context_tokens: int
    arrival_s: float = field(default_factory=time.monotonic)
    # Absolute time.monotonic() after which the request is dropped; None = no deadline.
    deadline_s: float | None = None
    namespace_salt: str = ""
    # Admission order among waiting requests: lower first, then arrival (vLLM's priority).
    priority: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    # Output tokens that came with the request (failover resume): not streamed again.
    num_resumed_tokens: int = 0
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    generator: torch.Generator | None = None
    # Cache namespace digest (model, KV layout, tenant salt); None: no prefix caching for it.
    namespace: bytes | None = None
    # Whether its KV may go to (and come from) the kvstore: not under a cache_salt, whose namespace only the
    # engine knows (the kvstore's grants name tenant salts), so its entries live in the device cache alone.
    host_cacheable: bool = True
    conversation_id: str = ""
    # Keep sliding-window KV from this position on: the window before the last message, so that
    # regenerating or editing that message can reuse the KV (see kv_cache_manager.set_retention).
    retain_local_from: int | None = None
    # Whether admission consulted the prefix caches since the request last held no KV (scheduler.py).
    prefix_looked_up: bool = False
    num_cached_device_tokens: int = 0
    num_cached_host_tokens: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    # The compiled constraint's state (sampling.constraint), advanced over every kept output token; None =
    # free text. Each sampled row of the request is masked to the tokens it allows.
    grammar: RequestGrammar | None = field(default=None, repr=False)
    # Chained hashes of the first whole blocks, computed once and extended as needed (tokens only grow).
    _block_hashes: list[BlockHash] = field(default_factory=list, repr=False)
    _hash_block_size: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if not self.sampling.greedy:
            self.generator = torch.Generator()
            seed = self.sampling.seed if self.sampling.seed is not None else torch.seed()
            self.generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def block_hashes(self, num_tokens: int, block_size: int) -> list[BlockHash]:
        """The chained hashes (salon/common/prefix_hash.py) of the whole blocks of the first num_tokens
        tokens, under the request's namespace."""
        if self.namespace is None:
            raise ValueError("a request without a cache namespace has no block hashes")
        if block_size != self._hash_block_size:
            self._block_hashes, self._hash_block_size = [], block_size
        known, wanted = self._block_hashes, num_tokens // block_size
        if len(known) < wanted:
            start = len(known) * block_size
            known.extend(
                block_hashes(
                    self.namespace,
                    self.token_slice(start, wanted * block_size),
                    block_size,
                    known[-1] if known else ROOT_PARENT,
                )
            )
        return known[:wanted]

    def token_at(self, position: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < n else self.output_token_ids[position - n]

    def token_slice(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]
