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
from services.engine.worker.sampler import SampledToken, sample


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
        bs = self.layout.block_size_tokens
        token_ids: list[int] = []
        positions: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        num_groups = len(self.layout.groups)
        max_blocks = max(len(c.block_tables[g]) for c in output.chunks for g in range(num_groups))
        tables = torch.zeros((num_groups, len(output.chunks), max_blocks), dtype=torch.int32)
        slots: list[list[int]] = [[] for _ in range(num_groups)]
        for s, chunk in enumerate(output.chunks):
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
                tables[g, s, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
                slots[g].extend(ids[p // bs] * bs + p % bs for p in range(start, end))
        dev = self.device
        return ForwardBatch(
            token_ids=torch.tensor(token_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=[tables[g].to(dev) for g in range(num_groups)],
            slot_mappings=[torch.tensor(s, dtype=torch.int64, device=dev) for s in slots],
            sample_rows=torch.tensor(sample_rows, dtype=torch.int64, device=dev),
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
        logits = self.model.logits(hidden[batch.sample_rows]).float().cpu()
        sampled = [c.request for c in output.chunks if c.needs_sample]
        if self.logits_observer is not None:
            self.logits_observer(sampled, logits)
        return sample(logits, [r.sampling for r in sampled], [r.generator for r in sampled], sampled)
