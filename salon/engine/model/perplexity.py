"""Perplexity with llama-perplexity's method (-c 512).

The token stream (BOS prepended when the model adds one, no special parsing) is cut into consecutive
chunks of ``chunk_tokens``; each chunk's first token is replaced by BOS (for models that add one; llama-
perplexity leaves the chunk as it is otherwise, bos_token_id=None here), the chunk runs as its own sequence
from position 0, and only the second half is scored: logits at positions [n/2, n-1) predict the
tokens at [n/2 + 1, n). PPL = exp(mean NLL) over all scored tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from salon.engine.model.attention import DenseAttention
from salon.engine.model.model import CausalLM


@dataclass(frozen=True)
class PerplexityResult:
    ppl: float
    num_scored_tokens: int
    nll_per_chunk: tuple[float, ...]


def chunk_nll(model: CausalLM, chunk: list[int], kv_int8: bool) -> tuple[float, int]:
    """Summed NLL of the second half of one chunk, and the number of tokens scored."""
    n = len(chunk)
    attn = DenseAttention(model.config, num_seqs=1, kv_int8=kv_int8)
    positions = attn.begin_step([n])
    hidden = model.forward(torch.tensor(chunk), positions, attn)
    first = n // 2
    logits = model.logits(hidden[first : n - 1])
    logprobs = torch.log_softmax(logits.to(torch.float64), dim=-1)
    targets = torch.tensor(chunk[first + 1 : n])
    nll = -logprobs.gather(1, targets[:, None]).sum().item()
    return nll, n - 1 - first


def perplexity(
    model: CausalLM,
    token_ids: list[int],
    bos_token_id: int | None,
    chunk_tokens: int = 512,
    kv_int8: bool = False,
    max_chunks: int | None = None,
) -> PerplexityResult:
    num_chunks = len(token_ids) // chunk_tokens
    if max_chunks is not None:
        num_chunks = min(num_chunks, max_chunks)
    total, count, per_chunk = 0.0, 0, []
    for c in range(num_chunks):
        chunk = list(token_ids[c * chunk_tokens : (c + 1) * chunk_tokens])
        if bos_token_id is not None:
            chunk[0] = bos_token_id
        nll, scored = chunk_nll(model, chunk, kv_int8)
        total, count = total + nll, count + scored
        per_chunk.append(nll / scored)
    return PerplexityResult(math.exp(total / count), count, tuple(per_chunk))
