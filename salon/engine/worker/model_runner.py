"""Runs one scheduled step: builds the ForwardBatch, calls the model, samples.

Token positions, block ids and slots are three address spaces: position p of a request lives in
block table entry p // BS of each group, at slot block_id * BS + p % BS of that group's blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from salon.engine.batch import SchedulerOutput
from salon.engine.kv.kv_cache import KVCache
from salon.engine.kv.kv_transfer import to_device
from salon.engine.request import Request, SamplingParams
from salon.engine.worker.attention_backend import ForwardBatch, PagedAttention
from salon.engine.worker.device_sampler import DeviceSampler
from salon.engine.worker.sampler import (
    DraftHistory,
    SampledToken,
    TokenHistory,
    greedy_ids,
    num_produced,
    plain_greedy,
    rewind_generator,
    sample,
)
from salon.kernels.backend import Ops


class ModelRunner:
    def __init__(
        self,
        model,
        kv_cache: KVCache,
        ops: Ops,
        device: torch.device | str = "cpu",
        device_sampling: bool | None = None,
    ) -> None:
        """device_sampling: sample every row where the logits are (DeviceSampler) rather than copying the rows
        that are not a plain argmax to the host sampler; None: on CUDA devices (on a CPU the host sampler's C
        kernel is the faster one, and tests force the device sampler on CPU tensors)."""
        self.model = model
        self.kv_cache = kv_cache
        self.layout = kv_cache.layout
        self.device = torch.device(device)
        if device_sampling is None:
            device_sampling = self.device.type == "cuda"
        self.device_sampler = DeviceSampler(self.device) if device_sampling else None
        self.attention = PagedAttention(kv_cache, ops.kv_write, ops.paged_attention, model.config.attn_scale)
        # Called each step with the logits rows f32[R, V] of the produced tokens and each row's request (a
        # request is named once per token it produced; tests check exactness on logits through it); None:
        # nothing extra is done.
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
                tables[g].extend([0] * (max_blocks - len(ids)))
                slots[g].extend(ids[p // bs] * bs + p % bs for p in range(start, end))
        num_tokens, num_sampled = len(token_ids), len(sample_rows)
        host = [*token_ids, *positions, *query_start_loc, *seq_lens, *sample_rows, *row_seq]
        for g in range(num_groups):
            host.extend(slots[g])
            host.extend(tables[g])
        packed = to_device(torch.tensor(host, dtype=torch.int64), self.device)
        fields = packed.split(
            [
                num_tokens,
                num_tokens,
                num_seqs + 1,
                num_seqs,
                num_sampled,
                num_tokens,
                *[n for _ in range(num_groups) for n in (num_tokens, num_seqs * max_blocks)],
            ]
        )
        per_group = fields[6:]
        return ForwardBatch(
            token_ids=fields[0],
            positions=fields[1],
            query_start_loc=fields[2].to(torch.int32),
            seq_lens=fields[3].to(torch.int32),
            block_tables=[per_group[2 * g + 1].view(num_seqs, max_blocks).to(torch.int32) for g in range(num_groups)],
            slot_mappings=[per_group[2 * g] for g in range(num_groups)],
            sample_rows=fields[4],
            max_query_tokens=max(c.num_tokens for c in chunks),
            row_seq=fields[5].to(torch.int32),
            max_position=max(positions),
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
        logits = self.model.logits(hidden[batch.sample_rows]).float()
        chunks = [c for c in output.chunks if c.needs_sample]
        if self.logits_observer is None and all(plain_greedy(c.request.sampling) for c in chunks):
            # Every row is a plain argmax: it runs where the logits are and only the ids come back (one copy).
            tokens = [SampledToken(token_id, None) for token_id in greedy_ids(logits)]
            return self._produced(chunks, tokens, [None] * len(chunks))[0]
        if self.device_sampler is not None:
            # Every row where the logits are: only the ids and the asked-for log-probs come back (one copy).
            tokens, generators, states = self.device_sampler.sample(logits, chunks)
            produced, kept_rows = self._produced(chunks, tokens, states, generators, self.device_sampler.rewind)
            if self.logits_observer is not None:
                owners = [c.request for c, p in zip(chunks, produced) for _ in p]
                self.logits_observer(owners, logits[kept_rows])
            return produced
        logits = logits.cpu()
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
                histories.append(
                    request
                    if j == 0 or not request.sampling.has_penalties
                    else DraftHistory(request.prompt_token_ids, request.output_token_ids + list(drafts[:j]))
                )
        tokens = sample(logits, params, generators, histories)
        produced, kept_rows = self._produced(chunks, tokens, states)
        if self.logits_observer is not None:
            owners = [c.request for c, p in zip(chunks, produced) for _ in p]
            self.logits_observer(owners, logits[kept_rows])
        return produced

    @staticmethod
    def _produced(
        chunks,
        tokens: list[SampledToken],
        states: list[torch.Tensor | None],
        generators: list[torch.Generator | None] | None = None,
        rewind: Callable[[torch.Generator | None, torch.Tensor | None, int], None] = rewind_generator,
    ) -> tuple[list[list[SampledToken]], list[int]]:
        """Per chunk, the tokens it keeps (accepted drafts and one more), and the rows they came from; each
        chunk's generator (the request's own unless given) is rewound to its produced rows' draws."""
        produced: list[list[SampledToken]] = []
        kept_rows: list[int] = []
        row = 0
        for i, (chunk, state) in enumerate(zip(chunks, states)):
            request, num_rows = chunk.request, chunk.num_draft_tokens + 1
            rows = tokens[row : row + num_rows]
            n = num_produced([t.token_id for t in rows], chunk.draft_token_ids, request.stop_token_ids)
            rewind(request.generator if generators is None else generators[i], state, n)
            produced.append(rows[:n])
            kept_rows.extend(range(row, row + n))
            row += num_rows
        return produced, kept_rows
