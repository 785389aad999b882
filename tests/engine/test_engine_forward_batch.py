"""ModelRunner.build_batch: a step's metadata, field by field, for a mixed batch (a prefill chunk that
crosses a block boundary, a decode whose oldest sliding-window block is released, a decode with drafts)."""

from __future__ import annotations

import pytest
import torch

from salon.engine.batch import ScheduledChunk, SchedulerOutput
from salon.engine.kv.kv_cache import KVCache
from salon.engine.kv.kv_layout import plan_layout
from salon.engine.worker.model_loading import load_model
from salon.engine.worker.model_runner import ModelRunner
from salon.kernels.cpu.paged_attention import paged_attention_c
from salon.kernels.paged_attention import PagedAttentionArgs
from tests.engine_testlib import make_request

BS = 4


def runner() -> ModelRunner:
    model, _ = load_model("synthetic-tiny", "int8")
    layout = plan_layout(model.config, BS, plan_layout(model.config, BS, 1 << 20).page_bytes * 16)
    assert [g.sliding_window_tokens for g in layout.groups] == [None, 32]  # group 0 global, group 1 sliding
    return ModelRunner(model, KVCache(layout), model.kernel_ops)


def test_build_batch_fields_are_exact() -> None:
    r = runner()
    a = ScheduledChunk(
        make_request("a", list(range(100, 106))), [100, 101, 102, 103, 104], 2, [[3, 7], [1, 8]], needs_sample=True
    )  # positions 2..6: blocks 0 and 1
    b = ScheduledChunk(make_request("b", list(range(50))), [9], 9, [[4, 6, 9], [None, 2, 5]], needs_sample=True)
    c = ScheduledChunk(
        make_request("c", list(range(8))),
        [20, 21, 22],
        4,
        [[10, 11], [12, 13]],
        needs_sample=True,
        draft_token_ids=(21, 22),
    )
    batch = r.build_batch(SchedulerOutput([a, b, c], []))
    assert batch.token_ids.tolist() == [100, 101, 102, 103, 104, 9, 20, 21, 22]
    assert batch.positions.tolist() == [2, 3, 4, 5, 6, 9, 4, 5, 6]
    assert batch.query_start_loc.tolist() == [0, 5, 6, 9] and batch.query_start_loc.dtype == torch.int32
    assert batch.seq_lens.tolist() == [7, 10, 7] and batch.seq_lens.dtype == torch.int32
    assert batch.row_seq.tolist() == [0, 0, 0, 0, 0, 1, 2, 2, 2] and batch.row_seq.dtype == torch.int32
    assert batch.sample_rows.tolist() == [4, 5, 6, 7, 8]  # each chunk's last row, and every draft's row before it
    # released entries read as block 0; tables padded with 0 to the longest
    assert batch.block_tables[0].tolist() == [[3, 7, 0], [4, 6, 9], [10, 11, 0]]
    assert batch.block_tables[1].tolist() == [[1, 8, 0], [0, 2, 5], [12, 13, 0]]
    assert all(t.dtype == torch.int32 for t in batch.block_tables)
    slot = lambda block, p: block * BS + p % BS
    assert batch.slot_mappings[0].tolist() == [
        slot(3, 2),
        slot(3, 3),
        slot(7, 4),
        slot(7, 5),
        slot(7, 6),
        slot(9, 9),
        slot(11, 4),
        slot(11, 5),
        slot(11, 6),
    ]
    assert batch.slot_mappings[1].tolist() == [
        slot(1, 2),
        slot(1, 3),
        slot(8, 4),
        slot(8, 5),
        slot(8, 6),
        slot(5, 9),
        slot(13, 4),
        slot(13, 5),
        slot(13, 6),
    ]
    assert batch.max_query_tokens == 5


def test_paged_attention_with_the_batch_row_seq_equals_without() -> None:
    """The C kernel given the step's row_seq gives the bits it computes from query_start_loc alone."""
    r = runner()
    a = ScheduledChunk(make_request("a", list(range(9))), list(range(9)), 0, [[0, 1, 2], [3, 4, 5]], needs_sample=True)
    b = ScheduledChunk(make_request("b", list(range(5))), [7], 4, [[6, 7], [8, 9]], needs_sample=True)
    batch = r.build_batch(SchedulerOutput([a, b], []))
    cfg = r.model.config
    g = torch.Generator().manual_seed(0)
    cache = r.kv_cache.slots[0]
    cache.k_cache.copy_(torch.randint(-127, 128, cache.k_cache.shape, generator=g, dtype=torch.int8))
    cache.v_cache.copy_(torch.randint(-127, 128, cache.v_cache.shape, generator=g, dtype=torch.int8))
    cache.k_scale.copy_(torch.rand(cache.k_scale.shape, generator=g))
    cache.v_scale.copy_(torch.rand(cache.v_scale.shape, generator=g))
    q = torch.randn(10, cfg.num_heads, cfg.head_dim, generator=g)
    args = lambda row_seq: PagedAttentionArgs(
        q,
        cache.k_cache,
        cache.v_cache,
        cache.k_scale,
        cache.v_scale,
        batch.block_tables[0],
        batch.query_start_loc,
        batch.seq_lens,
        0.25,
        None,
        batch.max_query_tokens,
        row_seq,
    )
    with_rows, without = paged_attention_c(args(batch.row_seq)), paged_attention_c(args(None))
    if without is None:
        pytest.skip("no C paged-attention kernel for this CPU")
    assert torch.equal(with_rows, without)
    swapped = paged_attention_c(args(torch.tensor([1] * 9 + [0], dtype=torch.int32)))
    assert not torch.equal(swapped, without)  # the kernel does read the rows' sequences from row_seq
