"""Sampling the next token of each request from its logits row.

Rows are independent: greedy rows take the argmax (first index on ties); other rows are sampled one
by one with the request's own seeded generator, so a request's tokens never depend on its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.engine.request import SamplingParams


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float | None


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """f32[V] logits -> probabilities after temperature, top-k and top-p."""
    x = logits.float() / params.temperature
    if 0 < params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if 0.0 < params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it included).
        drop_sorted = (cumulative - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(0, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum()
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator).item())


def sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    if params.greedy:
        return int(torch.argmax(logits).item())
    return draw(filtered_probs(logits, params), generator)


def advance_generator(generator: torch.Generator | None, vocab_size: int) -> None:
    """Consume the randomness one sampled token uses (failover resume skips tokens already sent)."""
    if generator is not None:
        probs = torch.full((vocab_size,), 1.0 / vocab_size)
        draw(probs, generator)


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[SampledToken]:
    """logits f32[R, V] -> one token per row."""
    logprobs = None
    if any(p.return_logprobs for p in params):
        logprobs = torch.log_softmax(logits.float(), dim=-1)
    greedy_ids = torch.argmax(logits, dim=-1).tolist()
    out: list[SampledToken] = []
    for r, (p, g) in enumerate(zip(params, generators)):
        token = greedy_ids[r] if p.greedy else sample_row(logits[r], p, g)
        lp = float(logprobs[r, token]) if (logprobs is not None and p.return_logprobs) else None
        out.append(SampledToken(token, lp))
    return out
