"""Token bitmasks: one int32 row of ceil(V / 32) words per sampled row, bit t % 32 of word t // 32 = token t.

These are plain torch ops, so they run where the logits are (CPU or CUDA): the host sampler, the device
sampler and the greedy fast path all mask the same way.
"""

from __future__ import annotations

import torch

_BITS = torch.arange(32, dtype=torch.int32)


def allocate_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """int32[num_rows, ceil(vocab_size / 32)], every token allowed."""
    return torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """bool[R, vocab] from int32[R, W]: token t allowed in row r (tokens past 32 W are not)."""
    bits = (bitmask.unsqueeze(-1) >> _BITS.to(bitmask.device)) & 1
    allowed = bits.flatten(1).bool()
    if allowed.shape[1] >= vocab:
        return allowed[:, :vocab]
    return torch.cat([allowed, allowed.new_zeros((allowed.shape[0], vocab - allowed.shape[1]))], dim=1)


def apply_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """In place: logits[rows[i], t] = -inf for every token t that bitmask[i] does not allow."""
    if not rows:
        return
    index = torch.tensor(rows, device=logits.device)
    allowed = allowed_tokens(bitmask.to(logits.device, non_blocking=True), logits.shape[1])
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
