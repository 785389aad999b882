"""sampler.py's rule as batched tensor ops on the rows of a step, run where the logits are.

Every op takes whole rows [R, V] and per-row parameters as tensors [R] on the logits' device, so a CUDA step
samples without copying a logits row to the host; a row's result depends only on that row (the ops reduce,
sort and scan along the vocabulary of each row on its own), never on its batch.

The arithmetic follows the reference (salon/engine/worker/sampler.py) operation for operation: penalties in
float32 with the parameters rounded to float32 (as torch rounds a Python scalar for a float32 tensor), x =
logits / temperature in float32, min_p's threshold max(x) + float32(ln min_p), weights exp(x - max(x)) in
float32 widened to float64, top-p's cut and the inverse CDF in float64. The rank order is x descending, then
token id ascending (a stable sort; salon/kernels/cpu/sample.c's order), which decides ties at a top-k or top-p
cut. Where the reference picks among tokens tied at a top-k cut by torch.topk's unspecified order, this picks
the lower ids.

On a CPU the float64 cumulative sums run in vocabulary or rank order one term at a time, as the reference's
do, so the kept set and the drawn token are the reference's; on CUDA the scans and exp round differently (a
row's result is still its own, and the same run after run).
"""

from __future__ import annotations

import torch


def apply_penalties_rows(
    logits: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    output_counts: torch.Tensor,
    seen: torch.Tensor,
) -> torch.Tensor:
    """f32[R, V] logits -> a new f32[R, V] with each row's penalties (sampler.apply_penalties per row).

    repetition, frequency, presence: f32[R]; output_counts: int32[R, V] occurrences of each token in the
    row's output; seen: bool[R, V] tokens of the row's prompt or output. A neutral parameter (1, 0, 0) leaves
    a row's bits unchanged: v / 1, v * 1 and v - 0 * c are v."""
    out = logits.float()
    rep = repetition[:, None]
    out = torch.where(seen, torch.where(out > 0, out / rep, out * rep), out)
    occurs = output_counts > 0
    out = torch.where(occurs, out - frequency[:, None] * output_counts.float(), out)
    return torch.where(occurs, out - presence[:, None], out)


def kept_weights(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, log_min_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens each sampled row may be drawn from, and their weights.

    logits f32[R, V] (penalties applied); temperature f32[R] (> 0); top_k int64[R] (0: no limit); top_p
    f64[R] (1: no limit); log_min_p f32[R] (ln min_p, -inf: no min_p). Returns (kept bool[R, V], weights
    f64[R, V]: exp(x - max x) of the kept tokens, 0 elsewhere), both in vocabulary order."""
    vocab = logits.shape[-1]
    x = logits.float() / temperature[:, None]
    top = x.max(dim=-1, keepdim=True).values
    # min_p keeps a prefix of the rank order: the tokens at or above max(x) + ln(min_p); it cuts top-k.
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    by_min_p = (x >= top + log_min_p[:, None]).sum(dim=-1)
    k = torch.where(torch.isfinite(log_min_p), torch.minimum(k, by_min_p), k)
    sorted_x, order = torch.sort(x, dim=-1, descending=True, stable=True)
    w = torch.exp(sorted_x - top).double()
    rank = torch.arange(vocab, device=logits.device)
    in_k = rank[None, :] < k[:, None]
    wk = torch.where(in_k, w, 0.0)
    # top-p: the smallest rank prefix whose mass reaches top_p of the top-k mass, the crossing token included.
    cumulative = torch.cumsum(wk, dim=-1)
    total = cumulative[:, -1:]
    by_p = (cumulative - wk) < top_p[:, None] * total
    keep_ranked = in_k & (by_p | (top_p[:, None] >= 1.0))
    kept = torch.zeros_like(keep_ranked).scatter_(1, order, keep_ranked)
    weights = torch.zeros_like(w).scatter_(1, order, torch.where(keep_ranked, w, 0.0))
    return kept, weights


def draw_rows(kept: torch.Tensor, weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """int64[R]: per row, the first kept token in vocabulary order at which the running weight exceeds
    u * (total weight) (sampler.draw); the last kept token if rounding leaves none. u: f64[R] in [0, 1).

    Dropped tokens weigh 0, so the running weight at a kept token is the reference's sum over kept tokens
    alone, and the first index past the target is always a kept token."""
    vocab = weights.shape[-1]
    cumulative = torch.cumsum(weights, dim=-1)
    target = u[:, None] * cumulative[:, -1:]
    index = torch.searchsorted(cumulative, target, right=True)[:, 0]
    ids = torch.arange(vocab, device=weights.device)
    last_kept = torch.where(kept, ids[None, :], -1).max(dim=-1).values
    return torch.minimum(index, last_kept)


def logprob_rows(
    logits: torch.Tensor, tokens: torch.Tensor, num_top: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's log-probs (before penalties, as sampler.sample returns them): (f32[R] of each row's token,
    int64[R, num_top] and f32[R, num_top] of the num_top most likely tokens, most likely first)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, tokens[:, None])[:, 0]
    if num_top == 0:
        empty = logprobs.new_zeros((logprobs.shape[0], 0))
        return chosen, empty.long(), empty
    values, ids = torch.topk(logprobs, num_top, dim=-1)
    return chosen, ids, values
