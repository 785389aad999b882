"""The step's input tensors, allocated once: every ForwardBatch the model sees is views of them.

A CUDA graph replays the kernels it captured on the addresses it captured, so a step's inputs must live at
fixed places (salon/engine/worker/cuda_graphs.py); eager steps use the same buffers, which is what lets the
padded path be tested without a GPU. One byte buffer on the device holds the step's fields; one host buffer
of the same layout is filled on the host and moved in ONE copy per step (pinned and non-blocking on CUDA;
on a CPU the two are one tensor and nothing is copied).

Layout of a step with T rows, S sequences and tables of W columns, in this order:
    int64: token_ids[T], positions[T], slot_mappings[g][T] per KV group, sample_rows[T] (the first R used)
    int32: query_start_loc[S + 1], seq_lens[S], row_seq[T], block_tables[g][S, W] per KV group
The offsets depend on (T, S, W) only, so every step of one padded size (T = S = the bucket, W = the engine's
widest table) finds its fields at the same addresses. An eager step's tables are as wide as its longest one
(the kernels' work on a table follows its width); a padded step's are max_blocks wide, the tables of the
engine's longest context.

Padded rows (pad_to): token 0 at position 0, slot -1 in every group (the KV write skips it), sequence length 0
with a table row of zeros (attention reads nothing for it and gives zeros), one query row each; they are not
sample rows, and whatever the model computes for them is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from salon.engine.batch import ScheduledChunk
from salon.engine.worker.attention_backend import ForwardBatch


def step_bytes(num_groups: int, num_tokens: int, num_seqs: int, width: int) -> int:
    """Bytes of a step's fields (the layout above)."""
    return 8 * (3 + num_groups) * num_tokens + 4 * (2 * num_seqs + 1 + num_tokens + num_groups * num_seqs * width)


class StepBuffers:
    def __init__(
        self,
        num_groups: int,
        block_size: int,
        max_tokens: int,
        max_seqs: int,
        max_blocks: int,
        device: torch.device | str = "cpu",
    ) -> None:
        """Sized for max_tokens rows of max_seqs sequences with tables of max_blocks columns. A step past that
        (only a caller that did not size them from the scheduler's limits makes one) reallocates them and
        bumps `generation`: views taken before then, and graphs captured on them, are stale."""
        self.num_groups = num_groups
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.device = torch.device(device)
        self.generation = 0
        self._copied: torch.cuda.Event | None = None  # the last host -> device copy, on CUDA
        self._allocate(step_bytes(num_groups, max_tokens, min(max_seqs, max_tokens), max_blocks))

    def _allocate(self, num_bytes: int) -> None:
        self.capacity = num_bytes
        self.device_buffer = torch.zeros(num_bytes, dtype=torch.uint8, device=self.device)
        if self.device.type == "cuda":
            self.host_buffer = torch.zeros(num_bytes, dtype=torch.uint8, pin_memory=True)
        else:
            self.host_buffer = self.device_buffer

    def move_in(self, num_bytes: int) -> None:
        """The step's one host -> device copy of its first num_bytes (pinned, non-blocking; the kernels that read
        them are queued behind it on the same stream). Nothing on a CPU, where the two buffers are one."""
        if self.host_buffer is self.device_buffer:
            return
        self.device_buffer[:num_bytes].copy_(self.host_buffer[:num_bytes], non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()

    def fill(self, chunks: Sequence[ScheduledChunk], pad_to: int | None = None) -> ForwardBatch:
        """The step of `chunks`, with padded sequences after them up to pad_to sequences when given (one row each,
        tables max_blocks wide), as views of the device buffer."""
        bs, num_groups = self.block_size, self.num_groups
        num_live = len(chunks)
        num_seqs = num_live if pad_to is None else pad_to
        if num_seqs < num_live:
            raise ValueError(f"pad_to={pad_to} is fewer than the step's {num_live} sequences")
        widest = max((len(c.block_tables[g]) for c in chunks for g in range(num_groups)), default=0)
        width = widest if pad_to is None else self.max_blocks
        if widest > width:
            raise ValueError(f"a block table of {widest} blocks is wider than the engine's {width}")
        token_ids: list[int] = []
        positions: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        row_seq: list[int] = []
        slots: list[list[int]] = [[] for _ in range(num_groups)]
        tables: list[list[int]] = [[] for _ in range(num_groups)]
        for seq, chunk in enumerate(chunks):
            start, end = chunk.start_position, chunk.start_position + chunk.num_tokens
            token_ids.extend(chunk.token_ids)
            row_seq.extend([seq] * chunk.num_tokens)
            positions.extend(range(start, end))
            query_start_loc.append(query_start_loc[-1] + chunk.num_tokens)
            seq_lens.append(end)
            if chunk.needs_sample:  # the last row, and every draft token's row before it
                sample_rows.extend(range(query_start_loc[-1] - 1 - chunk.num_draft_tokens, query_start_loc[-1]))
            for g, table in enumerate(chunk.block_tables):
                # Released (None) entries are never read by the kernel; 0 keeps the tensor valid.
                ids = [0 if b is None else b for b in table]
                tables[g].extend(ids)
                tables[g].extend([0] * (width - len(ids)))
                slots[g].extend(ids[p // bs] * bs + p % bs for p in range(start, end))
        num_padded = num_seqs - num_live
        token_ids.extend([0] * num_padded)
        positions.extend([0] * num_padded)
        row_seq.extend(range(num_live, num_seqs))
        query_start_loc.extend(range(query_start_loc[-1] + 1, query_start_loc[-1] + 1 + num_padded))
        seq_lens.extend([0] * num_padded)
        for g in range(num_groups):
            slots[g].extend([-1] * num_padded)
            tables[g].extend([0] * (num_padded * width))
        num_tokens, num_sampled = len(token_ids), len(sample_rows)
        ints64 = [*token_ids, *positions]
        for g in range(num_groups):
            ints64.extend(slots[g])
        ints64.extend(sample_rows)
        ints64.extend([0] * (num_tokens - num_sampled))
        ints32 = [*query_start_loc, *seq_lens, *row_seq]
        for g in range(num_groups):
            ints32.extend(tables[g])
        n64, n32 = len(ints64), len(ints32)
        num_bytes = 8 * n64 + 4 * n32
        if self._copied is not None:
            self._copied.synchronize()  # the host buffer is free again once the last step's copy is done
        if num_bytes > self.capacity:
            self._allocate(num_bytes)
            self.generation += 1
        self.host_buffer[: 8 * n64].view(torch.int64).copy_(torch.tensor(ints64, dtype=torch.int64))
        self.host_buffer[8 * n64 : num_bytes].view(torch.int32).copy_(torch.tensor(ints32, dtype=torch.int32))
        self.move_in(num_bytes)
        f64 = (
            self.device_buffer[: 8 * n64]
            .view(torch.int64)
            .split([num_tokens, num_tokens, *[num_tokens] * num_groups, num_tokens])
        )
        f32 = (
            self.device_buffer[8 * n64 : num_bytes]
            .view(torch.int32)
            .split([num_seqs + 1, num_seqs, num_tokens, *[num_seqs * width] * num_groups])
        )
        return ForwardBatch(
            token_ids=f64[0],
            positions=f64[1],
            query_start_loc=f32[0],
            seq_lens=f32[1],
            block_tables=[f32[3 + g].view(num_seqs, width) for g in range(num_groups)],
            slot_mappings=list(f64[2 : 2 + num_groups]),
            sample_rows=f64[2 + num_groups][:num_sampled],
            max_query_tokens=max(c.num_tokens for c in chunks) if chunks else 1,
            row_seq=f32[2],
            max_position=max(positions),
        )
