"""Decode steps at fixed batch sizes, replayed from CUDA graphs on a GPU.

A decode step on a GPU is mostly Python and kernel launches (docs/kernels.md); a CUDA graph replays the
step's launches in one call. A graph holds fixed shapes and addresses, so:

- decode-only steps (every sequence one new token, sampled, no draft tokens) run padded to a bucket, the
  smallest of 1, 2, 4, 8, 16, 24, ... (every 8 from 8 on, up to the first size that holds the scheduler's
  max_num_running) that holds their rows; padded rows (step_buffers.py) write no KV and their outputs are dropped;
- every input is a view of the persistent step buffers (step_buffers.py), whose padded layout puts a bucket's
  fields at the same addresses each step; the output (the logits of every row of the bucket) is a tensor the
  graph owns, read after replay;
- at warm-up, for each bucket from the largest down, the model runs once eagerly on a batch of padded rows
  (compiling the Triton kernels, settling allocations), then is captured into a torch.cuda.CUDAGraph; all
  graphs share one memory pool (torch.cuda.graph_pool_handle), which works because they never run at once and
  the largest, captured first, sizes it.

Steps that hold prefill chunks, or a decode's draft tokens, run eagerly on the same buffers: their query
lengths vary per sequence and per step, and the kernels' grids and the model's row counts follow them, so one
graph per shape would never be reused. Capturing only the parts between attention calls (piecewise capture, as
vLLM does) would take them too; that is a later step.

Capture needs the Triton family on CUDA: the reference family reads tensors back to the host inside a step,
which a graph cannot hold. Without capture (a CPU, or capture off) the padded path can still be forced on, so
the tests run the exact steps a GPU replays, eagerly.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from salon.engine.batch import ScheduledChunk
from salon.engine.worker.attention_backend import ForwardBatch, PagedAttention
from salon.engine.worker.step_buffers import StepBuffers


def padded_batch_sizes(max_num_running: int) -> list[int]:
    """The buckets: 1, 2, 4, 8, then every 8, up to the first that holds max_num_running rows."""
    if max_num_running < 1:
        raise ValueError(f"max_num_running must be at least 1, got {max_num_running}")
    sizes = [1]
    while sizes[-1] < max_num_running:
        sizes.append(sizes[-1] * 2 if sizes[-1] < 8 else sizes[-1] + 8)
    return sizes


def is_plain_decode(chunks: Sequence[ScheduledChunk]) -> bool:
    """Whether every chunk is one sampled token with no drafts (and no fetched KV): a step a graph can run."""
    return bool(chunks) and all(
        c.num_tokens == 1 and c.needs_sample and not c.draft_token_ids and c.host_kv is None for c in chunks
    )


class DecodeGraphs:
    """Runs decode-only steps at bucket sizes: replayed from CUDA graphs once captured, else eagerly."""

    def __init__(self, model, attention: PagedAttention, buffers: StepBuffers, max_num_running: int) -> None:
        self.model = model
        self.attention = attention
        self.buffers = buffers
        self.sizes = padded_batch_sizes(max_num_running)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._generation = buffers.generation  # the buffers the graphs were captured on
        self._pool = None

    @property
    def captured(self) -> list[int]:
        return sorted(self._graphs)

    def bucket(self, num_rows: int) -> int | None:
        """The smallest bucket that holds num_rows rows; None past the largest."""
        i = bisect.bisect_left(self.sizes, num_rows)
        return self.sizes[i] if i < len(self.sizes) else None

    def takes(self, chunks: Sequence[ScheduledChunk]) -> int | None:
        """The bucket the step runs as, or None where it runs unpadded (not a plain decode, a bucket past the
        largest, or a table wider than the buffers' fixed width)."""
        if not is_plain_decode(chunks):
            return None
        if any(len(t) > self.buffers.max_blocks for c in chunks for t in c.block_tables):
            return None
        return self.bucket(len(chunks))

    def logits(self, chunks: Sequence[ScheduledChunk], bucket: int) -> torch.Tensor:
        """f32[len(chunks), vocab]: the logits of the chunks' rows, in chunk order, from a step of `bucket` rows."""
        batch = self.buffers.fill(chunks, pad_to=bucket)
        if self._generation != self.buffers.generation:  # the buffers moved: the graphs read the old ones
            self._graphs.clear()
        held = self._graphs.get(bucket)
        if held is None:
            return self.forward_logits(batch)[: len(chunks)]
        graph, out = held
        graph.replay()
        return out[: len(chunks)]

    def forward_logits(self, batch: ForwardBatch) -> torch.Tensor:
        """The model over every row of the batch -> f32[rows, vocab]: what a graph captures."""
        self.attention.batch = batch
        try:
            hidden = self.model.forward(batch.token_ids, batch.positions, self.attention)
        finally:
            self.attention.batch = None
        return self.model.logits(hidden).float()

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture a graph per bucket, largest first, over one shared memory pool (CUDA only)."""
        if self.buffers.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self._pool = torch.cuda.graph_pool_handle()
        self._generation = self.buffers.generation
        for size in reversed(self.sizes):
            batch = self.buffers.fill([], pad_to=size)  # padded rows only: no KV written, nothing read
            self.forward_logits(batch)  # eager first: kernels compiled and autotuned outside the capture
            torch.cuda.synchronize(self.buffers.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self.forward_logits(batch)
            self._graphs[size] = (graph, out)
        torch.cuda.synchronize(self.buffers.device)
