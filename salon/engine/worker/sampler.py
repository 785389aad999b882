"""Sampling the next token of each request from its logits row.

Rows are independent: greedy rows take the argmax (first index on ties); every other row is sampled
on its own with the request's own seeded generator, so a request's tokens never depend on its batch.

Every row first gets the request's logit bias and masks (`apply_logit_masks`): each biased token's logit plus
its bias in float32, then -inf for the tokens the row may not take (a bias of -100, and the stop tokens while
the output is shorter than min_tokens). Log-probs are those of these logits. Then every row gets the request's
penalties (vLLM's semantics, `apply_penalties`), greedy rows too:
repetition (tokens of the prompt or the output: logit / p if positive, logit * p otherwise), then
frequency (minus f times the token's count in the output), then presence (minus p for a token that occurs
in the output). They depend only on the row's own request (its TokenHistory), so batching changes nothing.

A sampled row: x = logits / temperature; min_p keeps the tokens whose probability is at least min_p times
the most likely one's, i.e. x_i >= max(x) + ln(min_p) -- always a prefix of the rank order, so it is applied
as a cut of top-k (effective_top_k); top-k keeps the k most likely tokens (renormalized among them); top-p
then keeps the smallest prefix of the remaining tokens, most likely first, whose mass reaches top_p (the
token that crosses it included). One uniform u from the request's generator picks the token by inverse CDF
over the kept weights in vocabulary order, so every sampled token consumes exactly one draw
(`advance_generator` skips a token's draw when a failover resumes a stream).

Speculative decoding verifies a request's draft tokens as more rows of the same call: row j sees the
history the request would have if drafts [0, j) were accepted (`DraftHistory`) and the generator's
next draw in row order; `num_produced` says how many rows' tokens the request keeps, and
`rewind_generator` leaves the generator as if only those rows had drawn. Output position i thus gets
the same logits processing and the same uniform whether it was decoded alone or verified.

On CPUs with AVX-512, or AVX2 and FMA, all sampled rows of a step go through one call of salon/kernels/cpu/sample.c
(its AVX-512 or AVX2 build, which draw the same tokens); the PyTorch code below is its reference and the path
elsewhere (same rule, exp rounded differently), and of a row with masked (-inf) tokens at that step. On CUDA the
model runner samples every row where the logits are with the same rule instead (device_sampler.py), and copies
back only the ids. Greedy rows take salon/kernels/cpu/argmax.c's top-1 where it runs (torch.argmax's answer, in one
pass over each row).

A constrained row (a request with a grammar) arrives with -inf at every token its grammar does not allow
(grammar/bitmask.py, applied by the model runner); it is sampled by the same rule over its allowed tokens
only, compacted in vocabulary order -- the tokens the rule keeps and the draw are those of the whole row,
where the disallowed tokens weigh exactly 0 -- so that the -inf range costs no full sort. Its log-probs are
those of the masked row (as vLLM returns them).

The vocabulary is large (262,144 for Gemma), so nothing sorts it when it can be avoided: top-k is a
partial selection, and top-p first looks among the 64 most likely tokens (TOP_P_CANDIDATES) and, when their
mass falls short of top_p, finds the cut with a histogram of the mass over logit bins, sorting only the
tokens of the bin where it falls -- the kept set is the same as a full sort's.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from salon.engine.request import SamplingParams
from salon.kernels.cpu.argmax import argmax_rows_cpu
from salon.kernels.cpu.sample import sample_rows_cpu

# Top-p looks among this many most likely tokens first, then above a threshold found by a histogram.
TOP_P_CANDIDATES = 64
HISTOGRAM_BINS = 1024


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float | None
    # (token id, log-prob) of the request's num_top_logprobs most likely tokens, most likely first.
    top_logprobs: tuple[tuple[int, float], ...] = ()


class TokenHistory(Protocol):
    """What penalties and min_tokens read of a request (Request has both)."""

    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]


def apply_logit_masks(logits: torch.Tensor, params: SamplingParams, num_output_tokens: int) -> torch.Tensor:
    """f32[V] logits of one row -> a new row with the request's logit bias added and its masked tokens at -inf
    (SamplingParams.masked_token_ids at output position num_output_tokens)."""
    out = logits.float().clone()
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.int64)
        out[ids] = out[ids] + torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32)
    masked = params.masked_token_ids(num_output_tokens)
    if masked:
        out[torch.tensor(masked, dtype=torch.int64)] = -math.inf
    return out


def apply_penalties(logits: torch.Tensor, params: SamplingParams, history: TokenHistory) -> torch.Tensor:
    """f32[V] logits of one row -> a new row with the request's repetition, frequency and presence penalties."""
    out = logits.float().clone()
    output = torch.as_tensor(list(history.output_token_ids), dtype=torch.int64)
    if params.repetition_penalty != 1.0:
        seen = torch.unique(torch.cat([torch.as_tensor(list(history.prompt_token_ids), dtype=torch.int64), output]))
        vals = out[seen]
        out[seen] = torch.where(vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty)
    if output.numel() and (params.frequency_penalty != 0.0 or params.presence_penalty != 0.0):
        ids, counts = torch.unique(output, return_counts=True)
        out[ids] -= params.frequency_penalty * counts.to(torch.float32)
        out[ids] -= params.presence_penalty
    return out


def effective_top_k(logits: torch.Tensor, params: SamplingParams) -> int:
    """top_k with min_p folded in: min_p keeps the tokens with x_i >= max(x) + ln(min_p) (x = logits /
    temperature), a prefix of the rank order of the length counted here; 0 = no limit."""
    if params.min_p <= 0.0:
        return params.top_k
    x = logits.float() / params.temperature
    kept = int((x >= x.max() + math.log(params.min_p)).sum())
    return kept if params.top_k <= 0 else min(kept, params.top_k)


def _top_p_prefix(ids: torch.Tensor, w: torch.Tensor, total: torch.Tensor, top_p: float):
    """ids/w sorted most likely first, w unnormalized (float64), total: the mass they are relative to."""
    if top_p >= 1.0:
        return ids, w
    keep = int(((torch.cumsum(w, 0) - w) < top_p * total).sum())
    return ids[:keep], w[:keep]


def kept_tokens(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor | None, torch.Tensor]:
    """f32[V] logits of one row (penalties applied) -> (token ids or None for all of [0, V), unnormalized weights
    f64) of the tokens the row may be sampled from."""
    top_k = effective_top_k(logits, params)
    x = logits.float() / params.temperature
    vocab = x.numel()
    if 0 < top_k < vocab:
        vals, ids = torch.topk(x, top_k)
        w = torch.exp(vals - vals[0]).double()
        return _top_p_prefix(ids, w, w.sum(), params.top_p)
    m = x.max()
    e = torch.exp(x - m)
    if params.top_p >= 1.0:
        return None, e.double()  # plain temperature sampling: the whole vocabulary
    total = e.sum(dtype=torch.float64)
    goal = params.top_p * total
    if TOP_P_CANDIDATES < vocab:
        vals, ids = torch.topk(x, TOP_P_CANDIDATES)
        w = e[ids].double()
        if w.sum() >= goal:
            return _top_p_prefix(ids, w, total, params.top_p)
    return _top_p_by_histogram(x, e, total, params.top_p)


def _top_p_by_histogram(x: torch.Tensor, e: torch.Tensor, total: torch.Tensor, top_p: float):
    """Top-p without sorting the vocabulary: the mass of each of HISTOGRAM_BINS equal logit bins gives the
    bin where the mass from the top crosses top_p; every token of the bins above is kept, and only the
    crossing bin's tokens are sorted to find where the prefix ends. Returns the kept ids (not in order)."""
    finite = x[x > -math.inf]  # masked tokens (-inf) weigh 0 and stay in the lowest bin
    lo, hi = float(finite.min()), float(x.max())
    if not hi > lo:
        ids = torch.argsort(x, descending=True, stable=True)
        return _top_p_prefix(ids, e[ids].double(), total, top_p)
    bins = ((x.clamp(min=lo) - lo) * (HISTOGRAM_BINS / (hi - lo))).long().clamp_(0, HISTOGRAM_BINS - 1)
    w = e.double()
    from_top = torch.cumsum(torch.bincount(bins, weights=w, minlength=HISTOGRAM_BINS).flip(0), 0)
    crossing_from_top = min(int((from_top < top_p * total).sum()), HISTOGRAM_BINS - 1)
    crossing = HISTOGRAM_BINS - 1 - crossing_from_top
    above = from_top[crossing_from_top - 1] if crossing_from_top > 0 else torch.zeros((), dtype=torch.float64)
    in_bin = torch.nonzero(bins == crossing).flatten()
    in_bin = in_bin[torch.argsort(x[in_bin], descending=True, stable=True)]
    in_w = w[in_bin]
    keep = max(1, int(((above + torch.cumsum(in_w, 0) - in_w) < top_p * total).sum()))
    ids = torch.cat([torch.nonzero(bins > crossing).flatten(), in_bin[:keep]])
    return ids, w[ids]


def uniform(generator: torch.Generator | None) -> float:
    """The one draw in [0, 1) a sampled token uses."""
    return float(torch.rand(1, generator=generator, dtype=torch.float64))


def draw(ids: torch.Tensor | None, w: torch.Tensor, u: float) -> int:
    """The first kept token, in vocabulary order, at which the running weight exceeds u * (total weight)."""
    if ids is not None:
        order = torch.argsort(ids)
        ids, w = ids[order], w[order]
    cumulative = torch.cumsum(w, 0)
    i = min(int(torch.searchsorted(cumulative, u * cumulative[-1], right=True)), w.numel() - 1)
    return i if ids is None else int(ids[i])


def sample_row(logits: torch.Tensor, params: SamplingParams, u: float) -> int:
    """One row by PyTorch (the reference of salon/kernels/cpu/sample.c); u is ignored for greedy rows."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    return draw(*kept_tokens(logits, params), u)


def greedy_ids(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (first index on ties) as host ints: salon/kernels/cpu/argmax.c on CPU rows, else torch.argmax
    where the logits are, then one copy of the ids."""
    return argmax_rows_cpu(logits) or torch.argmax(logits, dim=-1).tolist()


def plain_greedy(params: SamplingParams) -> bool:
    """A row whose token is the argmax of its logits and that returns nothing else (no penalties, no
    log-probs): the model runner picks it where the logits are and copies back only the id."""
    return (
        params.greedy
        and not params.has_penalties
        and not params.has_logit_masks
        and not params.return_logprobs
        and not params.num_top_logprobs
    )


def advance_generator(generator: torch.Generator | None) -> None:
    """Consume the randomness one sampled token uses (failover resume skips tokens already sent)."""
    if generator is not None:
        uniform(generator)


@dataclass(frozen=True)
class DraftHistory:
    """The TokenHistory of a verified chunk's row j: the request's tokens and the drafts before row j
    (the row is only used when those drafts are accepted, i.e. when they are the real history)."""

    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]


def num_produced(sampled: Sequence[int], draft_token_ids: Sequence[int], stop_token_ids: frozenset[int]) -> int:
    """Tokens a verified chunk yields: row j's sampled token is the next output token while every draft
    before it was what the rows sampled. So the longest prefix of drafts equal to the sampled tokens is
    accepted, and the row after it (the first mismatch, or the bonus row when all drafts match) adds one
    more; a sampled stop token ends it early (the request ends there)."""
    for j, token in enumerate(sampled):
        if token in stop_token_ids or j >= len(draft_token_ids) or token != draft_token_ids[j]:
            return j + 1
    return len(sampled)


def rewind_generator(generator: torch.Generator | None, state: torch.Tensor | None, num_draws: int) -> None:
    """Put a generator back to `state` and consume num_draws draws: a verified chunk drew one uniform per
    row, but only its produced tokens may use up randomness, so that output position i always gets the
    generator's i-th draw however many tokens each step verified."""
    if generator is None or state is None:
        return
    generator.set_state(state)
    for _ in range(num_draws):
        uniform(generator)


def _sample_allowed(logits: torch.Tensor, params: SamplingParams, u: float) -> int:
    """One constrained row: the rule over its finite logits only, compacted in vocabulary order."""
    ids = torch.nonzero(torch.isfinite(logits)).flatten()
    allowed = logits.float()[ids].contiguous()
    picked = sample_rows_cpu(
        allowed.unsqueeze(0), [0], [params.temperature], [effective_top_k(allowed, params)], [params.top_p], [u]
    )
    index = picked[0] if picked is not None else sample_row(allowed, params, u)
    return int(ids[index])


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    histories: Sequence[TokenHistory] | None = None,
    masked_rows: Collection[int] = (),
) -> list[SampledToken]:
    """logits f32[R, V] -> one token per row; histories[r]: row r's request (needed when it has penalties or
    min_tokens); masked_rows: the constrained rows (-inf at the tokens their grammar does not allow).

    Log-probs are those of the model's distribution after the logit bias and masks, before penalties (vLLM's
    default for penalties; OpenAI's for logit_bias)."""
    masked = [r for r, p in enumerate(params) if p.has_logit_masks]
    penalized = [r for r, p in enumerate(params) if p.has_penalties]
    if (masked or penalized) and histories is None:
        raise ValueError("sampling with penalties or logit masks needs each row's token history")
    if masked:
        logits = logits.float().clone()
        for r in masked:
            logits[r] = apply_logit_masks(logits[r], params[r], len(histories[r].output_token_ids))
    raw = logits
    if penalized:
        logits = logits.float().clone()
        for r in penalized:
            logits[r] = apply_penalties(logits[r], params[r], histories[r])
    logprobs = None
    if any(p.return_logprobs or p.num_top_logprobs for p in params):
        logprobs = torch.log_softmax(raw.float(), dim=-1)
    tokens: list[int] = [0] * len(params)
    greedy = [r for r, p in enumerate(params) if p.greedy]
    if greedy:
        greedy_logits = logits if len(greedy) == len(params) else logits[greedy]
        ids = greedy_ids(greedy_logits)
        for r, token in zip(greedy, ids):
            tokens[r] = token
    rows = [r for r, p in enumerate(params) if not p.greedy and r not in masked_rows]
    for r in (r for r, p in enumerate(params) if not p.greedy and r in masked_rows):
        tokens[r] = _sample_allowed(logits[r], params[r], uniform(generators[r]))
    if rows:
        us = dict(zip(rows, (uniform(generators[r]) for r in rows)))
        # Rows with -inf logits (masked tokens) are drawn by the reference: the kernel's histogram spans [min, max].
        fast = [
            r for r in rows if r not in masked or not params[r].masked_token_ids(len(histories[r].output_token_ids))
        ]
        sampled = sample_rows_cpu(
            logits.float(),
            fast,
            [params[r].temperature for r in fast],
            [effective_top_k(logits[r], params[r]) for r in fast],
            [params[r].top_p for r in fast],
            [us[r] for r in fast],
        )
        if sampled is None:
            fast, sampled = [], []
        for r, token in zip(fast, sampled):
            tokens[r] = token
        for r in set(rows) - set(fast):
            tokens[r] = sample_row(logits[r], params[r], us[r])
    out: list[SampledToken] = []
    for r, (p, token) in enumerate(zip(params, tokens)):
        lp = float(logprobs[r, token]) if (logprobs is not None and p.return_logprobs) else None
        top: tuple[tuple[int, float], ...] = ()
        if p.num_top_logprobs and logprobs is not None:
            vals, ids = torch.topk(logprobs[r], p.num_top_logprobs)
            top = tuple(zip(ids.tolist(), vals.tolist()))
        out.append(SampledToken(token, lp, top))
    return out
