"""Runs one scheduled step: builds the ForwardBatch, calls the model, samples.

Token positions, block ids and slots are three address spaces: position p of a request lives in
block table entry p // BS of each group, at slot block_id * BS + p % BS of that group's blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.backend import Ops
from services.engine.core.request import Request, SamplingParams
from services.engine.core.scheduler import SchedulerOutput
from services.engine.kv.kv_cache import KVCache
from services.engine.worker.attention_backend import ForwardBatch, PagedAttention
from services.engine.worker.sampler import (DraftHistory, SampledToken, TokenHistory, num_produced, rewind_generator,
                                            sample)


class ModelRunner:
    def __init__(self, model, kv_cache: KVCache, ops: Ops, device: torch.device | str = "cpu") -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.layout = kv_cache.layout
        self.device = torch.device(device)
        self.attention = PagedAttention(kv_cache, ops.kv_write, ops.paged_attention, model.config.attn_scale)
        # Called each step with the logits rows f32[R, V] of the produced tokens and each row's request (a
        # request is named once per token it produced; tests check exactness on logits through it); None:
        # nothing extra is done.
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
            if chunk.needs_sample:  # the last row, and every draft token's row before it
                sample_rows.extend(range(query_start_loc[-1] - 1 - chunk.num_draft_tokens, query_start_loc[-1]))
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
    def execute(self, output: SchedulerOutput) -> list[list[SampledToken]]:
        """Compute the step; per chunk with needs_sample, in chunk order, the tokens it produced: one, or
        with draft tokens the accepted drafts and one more (sampler.num_produced)."""
        batch = self.build_batch(output)
        self.attention.batch = batch
        try:
            hidden = self.model.forward(batch.token_ids, batch.positions, self.attention)
        finally:
            self.attention.batch = None
        if batch.sample_rows.numel() == 0:
            return []
        logits = self.model.logits(hidden[batch.sample_rows]).float().cpu()
        chunks = [c for c in output.chunks if c.needs_sample]
        params: list[SamplingParams] = []
        generators: list[torch.Generator | None] = []
        histories: list[TokenHistory] = []
        states: list[torch.Tensor | None] = []
        for chunk in chunks:
            request, drafts = chunk.request, chunk.draft_token_ids
            states.append(request.generator.get_state() if drafts and request.generator is not None else None)
            for j in range(len(drafts) + 1):
                params.append(request.sampling)
                generators.append(request.generator)
                histories.append(request if j == 0 or not request.sampling.has_penalties else
                                 DraftHistory(request.prompt_token_ids, request.output_token_ids + list(drafts[:j])))
        tokens = sample(logits, params, generators, histories)
        produced: list[list[SampledToken]] = []
        kept_rows: list[int] = []
        row = 0
        for chunk, state in zip(chunks, states):
            request, num_rows = chunk.request, chunk.num_draft_tokens + 1
            rows = tokens[row:row + num_rows]
            n = num_produced([t.token_id for t in rows], chunk.draft_token_ids, request.stop_token_ids)
            rewind_generator(request.generator, state, n)
            produced.append(rows[:n])
            kept_rows.extend(range(row, row + n))
            row += num_rows
        if self.logits_observer is not None:
            owners = [c.request for c, p in zip(chunks, produced) for _ in p]
            self.logits_observer(owners, logits[kept_rows])
        return produced
