"""What the scheduler hands the model runner for one step: the chunks of requests to compute.

Each chunk is a run of one request's tokens with its block tables after allocation; the first chunk
after a host prefix hit also carries the KV fetched from the kvstore, written into the request's
blocks before the step runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from salon.engine.request import Request, RequestId

if TYPE_CHECKING:
    # Annotation only: block ids are the KV cache's (kv/kv_layout.py), a layer above the batch.
    from salon.engine.kv.kv_layout import BlockTable


@dataclass(frozen=True)
class HostKV:
    """KV of a context's first blocks as fetched from the kvstore (kv_transfer.py's payload rows)."""

    global_kv: torch.Tensor  # uint8[num_blocks, global_bytes_per_block], blocks [0, num_blocks)
    local_kv: torch.Tensor  # uint8[num_blocks - local_first_block, local_bytes_per_block]
    local_first_block: int


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens [start_position, start_position + len(token_ids)) of one request, computed this step."""

    request: Request
    token_ids: list[int]
    start_position: int
    # Per KV cache group (kv_layout.py), the request's block table after allocation.
    block_tables: list[BlockTable]
    # True when the chunk reaches the request's last token: its logits row is sampled.
    needs_sample: bool
    # KV fetched from the kvstore for blocks [0, start_position / BS): written into the request's
    # blocks before the step runs (the first chunk after a host hit only).
    host_kv: HostKV | None = None
    # Speculative decoding: the chunk's last tokens are these drafts, not (yet) the request's; every
    # row from the request's last token on is sampled, and only accepted drafts become its tokens.
    draft_token_ids: tuple[int, ...] = ()

    @property
    def num_draft_tokens(self) -> int:
        return len(self.draft_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk]
    preempted: list[RequestId]

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks
