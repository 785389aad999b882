"""Runs one scheduled step: builds the ForwardBatch, calls the model, samples.

Token positions, block ids and slots are three address spaces: position p of a request lives in
block table entry p // BS of each group, at slot block_id * BS + p % BS of that group's blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.backend import Ops
from services.engine.core.request import Request
from services.engine.core.scheduler import SchedulerOutput
from services.engine.kv.kv_cache import KVCache
from services.engine.worker.attention_backend import ForwardBatch, PagedAttention
from services.engine.worker.sampler import SampledToken, plain_greedy, sample


class ModelRunner:
    def __init__(self, model, kv_cache: KVCache, ops: Ops, device: torch.device | str = "cpu") -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.layout = kv_cache.layout
        self.device = torch.device(device)
        self.attention = PagedAttention(kv_cache, ops.kv_write, ops.paged_attention, model.config.attn_scale)
        # Called with the sampled requests and their logits rows f32[R, V] each step (tests check exactness
        # on logits through it); None: nothing extra is done.
        self.logits_observer: Callable[[list[Request], torch.Tensor], None] | None = None

    def build_batch(self, output: SchedulerOutput) -> ForwardBatch:
        """The step's metadata, built on the host in one int64 buffer and moved to the device in one
        (pinned, non-blocking) copy; the tensors are views of that one copy."""
        bs = self.layout.block_size_tokens
        num_groups = len(self.layout.groups)
        chunks = output.chunks
        num_seqs = len(chunks)
        max_blocks = max(len(c.block_tables[g]) for c in chunks for g in range(num_groups))
        token_ids: list[int] = []
        positions: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        slots: list[list[int]] = [[] for _ in range(num_groups)]
        tables: list[list[int]] = [[] for _ in range(num_groups)]
        for chunk in chunks:
            start, end = chunk.start_position, chunk.start_position + chunk.num_tokens
            token_ids.extend(chunk.token_ids)
            positions.extend(range(start, end))
            query_start_loc.append(query_start_loc[-1] + chunk.num_tokens)
            seq_lens.append(end)
            if chunk.needs_sample:
                sample_rows.append(query_start_loc[-1] - 1)
            for g, table in enumerate(chunk.block_tables):
                # Released (None) entries are never read by the kernel; 0 keeps the tensor valid.
                ids = [0 if b is None else b for b in table]
                tables[g].extend(ids)
                tables[g].extend([0] * (max_blocks - len(ids)))
                slots[g].extend(ids[p // bs] * bs + p % bs for p in range(start, end))
        num_tokens, num_sampled = len(token_ids), len(sample_rows)
        host = [*token_ids, *positions, *query_start_loc, *seq_lens, *sample_rows]
        for g in range(num_groups):
            host.extend(slots[g])
            host.extend(tables[g])
        packed = to_device(torch.tensor(host, dtype=torch.int64), self.device)
        fields = packed.split([num_tokens, num_tokens, num_seqs + 1, num_seqs, num_sampled,
                               *[n for _ in range(num_groups) for n in (num_tokens, num_seqs * max_blocks)]])
        per_group = fields[5:]
        return ForwardBatch(
            token_ids=fields[0],
            positions=fields[1],
            query_start_loc=fields[2].to(torch.int32),
            seq_lens=fields[3].to(torch.int32),
            block_tables=[per_group[2 * g + 1].view(num_seqs, max_blocks).to(torch.int32) for g in range(num_groups)],
            slot_mappings=[per_group[2 * g] for g in range(num_groups)],
            sample_rows=fields[4],
            max_query_tokens=max(c.num_tokens for c in chunks),
        )

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> list[SampledToken]:
        """Compute the step; one sampled token per chunk with needs_sample, in chunk order."""
        batch = self.build_batch(output)
        self.attention.batch = batch
        try:
            hidden = self.model.forward(batch.token_ids, batch.positions, self.attention)
        finally:
            self.attention.batch = None
        if batch.sample_rows.numel() == 0:
            return []
        logits = self.model.logits(hidden[batch.sample_rows]).float()
        sampled = [c.request for c in output.chunks if c.needs_sample]
        if self.logits_observer is None and all(plain_greedy(r.sampling) for r in sampled):
            # The argmax runs where the logits are; only the ids come back (one copy).
            ids = torch.argmax(logits, dim=-1).tolist()
            return [SampledToken(token_id, None) for token_id in ids]
        logits = logits.cpu()
        if self.logits_observer is not None:
            self.logits_observer(sampled, logits)
        return sample(logits, [r.sampling for r in sampled], [r.generator for r in sampled], sampled)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`: through pinned memory and a non-blocking copy on CUDA (the step's
    kernels are queued behind it on the same stream); the tensor itself elsewhere."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)
