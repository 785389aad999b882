"""The shape of the KV an engine stores, and the usable-prefix rule it implies.

Bytes are opaque to the kvstore: per block there is one payload of global-layer KV (every block of
a context needs it) and, optionally, one of local (sliding-window) layer KV (only the blocks inside
the window before a match point need it). The engine defines what the bytes mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from salon.common.prefix_hash import TOKEN_ID_BYTES


@dataclass(frozen=True, slots=True)
class KVLayout:
    block_size_tokens: int
    global_bytes_per_block: int
    local_bytes_per_block: int
    sliding_window_tokens: int

    def problems(self) -> list[str]:
        """What is wrong with this layout, each naming the field (empty when valid)."""
        out = []
        if self.block_size_tokens <= 0:
            out.append("layout.block_size_tokens must be positive")
        if self.global_bytes_per_block <= 0:
            out.append("layout.global_bytes_per_block must be positive")
        if self.sliding_window_tokens < 0:
            out.append("layout.sliding_window_tokens must not be negative")
        if self.sliding_window_tokens > 0 and self.local_bytes_per_block <= 0:
            out.append("layout.local_bytes_per_block must be positive when sliding_window_tokens > 0")
        if self.sliding_window_tokens == 0 and self.local_bytes_per_block != 0:
            out.append("layout.local_bytes_per_block must be 0 when sliding_window_tokens is 0")
        return out

    @property
    def block_key_bytes(self) -> int:
        """Bytes of one block's canonically encoded token ids."""
        return self.block_size_tokens * TOKEN_ID_BYTES

    @property
    def window_blocks(self) -> int:
        """Blocks of local KV a continuation at a block boundary p = k * block_size needs.

        The query at position p attends keys at positions > p - W, so the cached keys it needs are
        [p - W + 1, p), which lie in blocks [(p - W + 1) // B, k): that is min(k, ceil((W - 1) / B))
        blocks (W = 512, B = 16: the last 32 blocks). 0 when the model has no sliding layers.
        """
        w, b = self.sliding_window_tokens, self.block_size_tokens
        return 0 if w <= 1 else -(-(w - 1) // b)

    def needed_local_blocks(self, num_blocks: int) -> int:
        """How many trailing blocks of a num_blocks-block prefix need local KV to be usable."""
        return min(num_blocks, self.window_blocks)


@dataclass(frozen=True, slots=True)
class MatchResult:
    """How much of a context's prefix is stored, and how much of it a continuation can use."""

    matched_tokens: int
    usable_tokens: int


MISS = MatchResult(0, 0)
