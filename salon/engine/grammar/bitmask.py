"""Token bitmasks: one int32 row of ceil(V / 32) words per sampled row, bit t % 32 of word t // 32 = token t.

apply_bitmask runs where the logits are: on a CPU, xgrammar's kernel; elsewhere (CUDA) plain torch ops. The
host sampler, the device sampler and the greedy fast path all see the same masked rows. The torch ops read the
words as their bytes, in memory order (little-endian on x86 and CUDA: byte k of word w holds tokens
32 w + 8 k .. + 7), each byte expanded to its 8 bits by a 256-entry table: one gather, no shifts over the
whole vocabulary.
"""

from __future__ import annotations

import torch

# _BYTE_BITS[b, j]: bit j of byte b.
_BYTE_BITS = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).bool()


def allocate_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """int32[num_rows, ceil(vocab_size / 32)], every token allowed."""
    return torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """bool[R, vocab] from int32[R, W]: token t allowed in row r (tokens past 32 W are not)."""
    table = _BYTE_BITS.to(bitmask.device)
    allowed = table[bitmask.contiguous().view(torch.uint8).long()].flatten(1)
    if allowed.shape[1] >= vocab:
        return allowed[:, :vocab]
    return torch.cat([allowed, allowed.new_zeros((allowed.shape[0], vocab - allowed.shape[1]))], dim=1)


def apply_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """In place: logits[rows[i], t] = -inf for every token t that bitmask[i] does not allow (f32 logits on a
    CPU: xgrammar's kernel, the same result; elsewhere: apply_bitmask_torch)."""
    if not rows:
        return
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.shape[1] <= 32 * bitmask.shape[1]:
        import xgrammar

        full = torch.full((logits.shape[0], bitmask.shape[1]), -1, dtype=torch.int32)
        full[rows] = bitmask
        xgrammar.apply_token_bitmask_inplace(logits, full)
        return
    apply_bitmask_torch(logits, rows, bitmask)


def apply_bitmask_torch(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """apply_bitmask in torch ops, wherever the logits are."""
    if not rows:
        return
    disallowed = ~allowed_tokens(bitmask.to(logits.device, non_blocking=True), logits.shape[1])
    if rows == list(range(logits.shape[0])):
        logits.masked_fill_(disallowed, float("-inf"))
        return
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(disallowed, float("-inf"))
