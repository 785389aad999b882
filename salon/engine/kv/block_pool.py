"""The free block ids of the paged KV cache: one pool for every KV cache group.

Ids are handed out oldest-freed first, so the ids a sequence of requests gets are deterministic
(tests assert them exactly). The pool holds ids only, never tensors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from salon.engine.kv.kv_layout import BlockId


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[BlockId] = deque(BlockId(i) for i in range(num_blocks))
        self._is_free = [True] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, num_blocks: int) -> list[BlockId]:
        if num_blocks > len(self._free):
            raise RuntimeError(f"allocate({num_blocks}) with {len(self._free)} free blocks")
        ids = [self._free.popleft() for _ in range(num_blocks)]
        for b in ids:
            self._is_free[b] = False
        return ids

    def free(self, block_ids: Iterable[BlockId]) -> None:
        for b in block_ids:
            if self._is_free[b]:
                raise RuntimeError(f"block {b} freed twice")
            self._is_free[b] = True
            self._free.append(b)
