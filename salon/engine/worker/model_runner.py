"""Runs one scheduled step: builds the ForwardBatch (views of the persistent step buffers, step_buffers.py),
calls the model (decode-only steps through cuda_graphs.py where padding or capture is on), samples.

Constrained rows (requests with a grammar): their token bitmasks are filled on a helper thread while the
model runs (a row's mask depends only on the request's kept tokens and the chunk's drafts, all known when the
step starts; the model's kernels release the GIL while they run), then applied to the logits (-inf at the
disallowed tokens, grammar/bitmask.py) before any sampling path: the greedy fast path, the device sampler
and the host sampler all see the masked rows. A chunk with drafts has one mask per sampled row: row j's is
the grammar's after drafts [0, j) (the matcher advanced through them and rolled back, grammar/matcher.py).

Token positions, block ids and slots are three address spaces: position p of a request lives in
block table entry p // BS of each group, at slot block_id * BS + p % BS of that group's blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from salon.engine.batch import ScheduledChunk, SchedulerOutput
from salon.engine.grammar.bitmask import allocate_bitmask, apply_bitmask
from salon.engine.kv.kv_cache import KVCache
from salon.engine.request import Request, SamplingParams
from salon.engine.worker.attention_backend import ForwardBatch, PagedAttention
from salon.engine.worker.cuda_graphs import DecodeGraphs, padded_batch_sizes
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
from salon.engine.worker.step_buffers import StepBuffers
from salon.kernels.backend import Ops


class ModelRunner:
    def __init__(
        self,
        model,
        kv_cache: KVCache,
        ops: Ops,
        device: torch.device | str = "cpu",
        *,
        max_num_tokens: int = 256,
        max_num_running: int = 64,
        max_context_tokens: int | None = None,
        cuda_graphs: bool = False,
        pad_decode: bool = False,
        device_sampling: bool | None = None,
    ) -> None:
        """max_num_tokens, max_num_running: the scheduler's step budget and running requests (what the step
        buffers and the decode buckets are sized for); max_context_tokens: the longest context (the fixed width
        of padded steps' block tables; default: the model's). cuda_graphs: capture decode graphs, where the
        device is CUDA and the ops are the Triton family (cuda_graphs.py); pad_decode: run decode-only steps
        padded to their bucket without capture (the same path eagerly: how the CPU tests run it).
        device_sampling: sample every row where the logits are (DeviceSampler) rather than copying the rows
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
        context = min(max_context_tokens or model.config.max_context_tokens, model.config.max_context_tokens)
        capture = cuda_graphs and self.device.type == "cuda" and ops.name == "triton"
        sizes = padded_batch_sizes(max_num_running)
        self.buffers = StepBuffers(
            len(self.layout.groups),
            self.layout.block_size_tokens,
            max(max_num_tokens, sizes[-1]),
            max(max_num_running, sizes[-1]),
            -(-context // self.layout.block_size_tokens),
            self.device,
        )
        # Decode-only steps at bucket sizes (None: every step unpadded).
        self.graphs = (
            DecodeGraphs(model, self.attention, self.buffers, max_num_running) if capture or pad_decode else None
        )
        if capture:
            self.graphs.capture()
        # Called each step with the logits rows f32[R, V] of the produced tokens and each row's request (a
        # request is named once per token it produced; tests check exactness on logits through it); None:
        # nothing extra is done.
        self.logits_observer: Callable[[list[Request], torch.Tensor], None] | None = None
        self._mask_filler: ThreadPoolExecutor | None = None

    def _fill_masks(self, output: SchedulerOutput) -> Future | None:
        """Start filling the step's constrained rows' bitmasks; the future gives (rows, int32[len(rows), W])."""
        chunks = [c for c in output.chunks if c.needs_sample]
        if not any(c.request.grammar is not None for c in chunks):
            return None
        if self._mask_filler is None:
            self._mask_filler = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        return self._mask_filler.submit(_constrained_rows, chunks)

    def build_batch(self, output: SchedulerOutput) -> ForwardBatch:
        """The step's metadata, unpadded, as views of the persistent step buffers (step_buffers.py: one
        host buffer, one pinned non-blocking copy on CUDA)."""
        return self.buffers.fill(output.chunks)

    def _sampled_logits(self, output: SchedulerOutput) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The model call: f32[R, vocab], the logits of the step's sample rows in order (None without any), and
        each row's argmax of them where the output projection found it on the way (model.logits_and_argmax), else
        None."""
        bucket = None if self.graphs is None else self.graphs.takes(output.chunks)
        if bucket is not None:
            return self.graphs.logits(output.chunks, bucket), None
        batch = self.build_batch(output)
        self.attention.batch = batch
        try:
            hidden = self.model.forward(batch.token_ids, batch.positions, self.attention)
        finally:
            self.attention.batch = None
        if batch.sample_rows.numel() == 0:
            return None, None
        logits, argmax = self.model.logits_and_argmax(hidden[batch.sample_rows])
        return logits.float(), argmax

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> list[list[SampledToken]]:
        """Compute the step; per chunk with needs_sample, in chunk order, the tokens it produced: one, or
        with draft tokens the accepted drafts and one more (sampler.num_produced)."""
        masks = self._fill_masks(output)
        try:
            logits, argmax = self._sampled_logits(output)
        except BaseException:
            if masks is not None:  # the matchers are mid-fill: let them settle before anything else reads them
                masks.exception()
            raise
        if logits is None:
            return []
        chunks = [c for c in output.chunks if c.needs_sample]
        masked_rows: list[int] = []
        if masks is not None:
            masked_rows, bitmask = masks.result()
            apply_bitmask(logits, masked_rows, bitmask)
        if self.logits_observer is None and all(plain_greedy(c.request.sampling) for c in chunks):
            # Every row is a plain argmax: it runs where the logits are and only the ids come back (one copy); the
            # output projection's own where it found them and no grammar masked a row.
            ids = argmax.tolist() if argmax is not None and not masked_rows else greedy_ids(logits)
            tokens = [SampledToken(token_id, None) for token_id in ids]
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
                    if j == 0 or not (request.sampling.has_penalties or request.sampling.has_logit_masks)
                    else DraftHistory(request.prompt_token_ids, request.output_token_ids + list(drafts[:j]))
                )
        tokens = sample(logits, params, generators, histories, masked_rows=frozenset(masked_rows))
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


def _constrained_rows(chunks: list[ScheduledChunk]) -> tuple[list[int], torch.Tensor]:
    """The logits rows of the constrained chunks (each: its draft rows, then its last row) and their bitmasks,
    one per row in the same order."""
    rows: list[int] = []
    grammars = []
    row = 0
    for chunk in chunks:
        if chunk.request.grammar is not None:
            rows.extend(range(row, row + chunk.num_draft_tokens + 1))
            grammars.append((len(rows) - chunk.num_draft_tokens - 1, chunk))
        row += chunk.num_draft_tokens + 1
    bitmask = allocate_bitmask(len(rows), grammars[0][1].request.grammar.vocab_size)
    for first, chunk in grammars:
        if chunk.draft_token_ids:
            chunk.request.grammar.fill_draft_bitmasks(bitmask, first, chunk.draft_token_ids)
        else:
            chunk.request.grammar.fill_bitmask(bitmask, first)
    return rows, bitmask
