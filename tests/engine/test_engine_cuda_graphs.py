"""Decode steps padded to fixed batch sizes on persistent step buffers (worker/cuda_graphs.py, step_buffers.py).

On the CPU the runner's padding is forced on (ModelRunner(pad_decode=True)): the exact padded static-buffer
path a GPU captures and replays, run eagerly. Its logits are bit for bit those of the plain path for decode
steps of 1, 3, 5 and 9 rows (padded to 1, 4, 8 and 16), over requests of different lengths through sliding-window
layers, in the `cpu` and `ref` op families (and 3 rows in the `triton` one under Triton's interpreter); padded rows
write no KV. A GPU test captures the graphs and checks replay against eager.
"""

from __future__ import annotations

import pytest
import torch

from salon.engine.batch import ScheduledChunk
from salon.engine.worker.cuda_graphs import padded_batch_sizes
from salon.engine.worker.model_loading import load_model
from salon.engine.worker.model_runner import ModelRunner
from salon.kernels.backend import select_ops
from tests.engine_testlib import logits_rows, make_core, make_request, tokens
from tests.triton_interpreter import row_independent_dot

CONTEXT = 128  # the runner's context: padded tables are 8 blocks wide (small for the interpreter)
LENGTHS = [5, 40, 17, 33, 9, 60, 2, 31, 48]  # across the sliding layers' window of 32
BUCKET = {1: 1, 3: 4, 5: 8, 9: 16}


def padded(core, kernels: str, device: str = "cpu"):
    """The core with its runner rebuilt with decode padding forced on; the buckets it ran are recorded."""
    core.runner = ModelRunner(
        core.model,
        core.kv_cache,
        select_ops(device, kernels),
        device,
        max_num_tokens=core.scheduler.config.max_num_batched_tokens,
        max_num_running=core.scheduler.config.max_num_running,
        max_context_tokens=CONTEXT,
        pad_decode=True,
    )
    graphs = core.runner.graphs
    core.buckets_run = []
    run = graphs.logits

    def recorded(chunks, bucket):
        core.buckets_run.append((len(chunks), bucket))
        return run(chunks, bucket)

    graphs.logits = recorded
    return core


def requests(n: int, new: int, vocab: int):
    return [
        make_request(f"r{i}", [t % vocab for t in tokens(LENGTHS[i], seed=i)], new + i % 2, max_context_tokens=CONTEXT)
        for i in range(n)
    ]


def caches(core) -> list[torch.Tensor]:
    return [t.clone() for s in core.kv_cache.slots for t in (s.k_cache, s.v_cache, s.k_scale, s.v_scale)]


def check_padded_equals_plain(model_and_tok, kernels: str, n: int, new: int) -> None:
    vocab = model_and_tok[0].config.vocab_size
    plain = make_core(model_and_tok, budget=4096, max_running=16, prefix_caching=False, kernels=kernels)
    want = logits_rows(plain, requests(n, new, vocab))
    core = padded(make_core(model_and_tok, budget=4096, max_running=16, prefix_caching=False, kernels=kernels), kernels)
    got = logits_rows(core, requests(n, new, vocab))
    assert (n, BUCKET[n]) in core.buckets_run  # the decode steps ran padded
    assert all(bucket == min(s for s in (1, 2, 4, 8, 16) if s >= rows) for rows, bucket in core.buckets_run)
    for rid, rows in want.items():
        assert len(got[rid]) == len(rows) > 1
        for step, (a, b) in enumerate(zip(got[rid], rows)):
            assert torch.equal(a, b), f"{rid} step {step}: logits differ by {(a - b).abs().max().item():.3e}"
    # Padded rows wrote nowhere: the caches hold the plain run's bytes exactly.
    for a, b in zip(caches(core), caches(plain)):
        assert torch.equal(a, b)


@pytest.fixture(scope="module")
def tiny():
    return load_model("synthetic-tiny", "int8")


@pytest.fixture(scope="module")
def tiny_ref():
    return load_model("synthetic-tiny", "int8", "cpu", kernels="ref")


@pytest.mark.parametrize("n", [1, 3, 5, 9])
def test_padded_decode_logits_equal_plain_cpu_family(tiny, n):
    check_padded_equals_plain(tiny, "cpu", n, new=3)


@pytest.mark.parametrize("n", [1, 3, 5, 9])
def test_padded_decode_logits_equal_plain_ref_family(tiny_ref, n):
    check_padded_equals_plain(tiny_ref, "ref", n, new=3)


@pytest.fixture(scope="module")
def triton_tiny():
    with pytest.MonkeyPatch.context() as mp:
        row_independent_dot(mp)  # as tests/engine/test_engine_triton_interpreted.py: rows on their own
        yield load_model("synthetic-tiny-v4k", "int8", "cpu", kernels="triton")


@pytest.mark.parametrize("n", [3])  # the interpreter is slow: 3 rows padded to 4, then 1 (about 100 s)
def test_padded_decode_logits_equal_plain_triton_interpreted(triton_tiny, n):
    with pytest.MonkeyPatch.context() as mp:
        row_independent_dot(mp)
        check_padded_equals_plain(triton_tiny, "triton", n, new=2)


@pytest.mark.parametrize("kernels", ["cpu", "ref"])
def test_a_step_of_padded_rows_only_changes_no_cache_byte(tiny, tiny_ref, kernels):
    """What warm-up captures: every row padded. The KV cache is full of noise, so any write would show."""
    core = padded(make_core(tiny if kernels == "cpu" else tiny_ref, max_running=16, kernels=kernels), kernels)
    g = torch.Generator().manual_seed(0)
    for s in core.kv_cache.slots:
        s.k_cache.copy_(torch.randint(-127, 128, s.k_cache.shape, generator=g, dtype=torch.int8))
        s.v_cache.copy_(torch.randint(-127, 128, s.v_cache.shape, generator=g, dtype=torch.int8))
        s.k_scale.copy_(torch.rand(s.k_scale.shape, generator=g))
        s.v_scale.copy_(torch.rand(s.v_scale.shape, generator=g))
    before = caches(core)
    graphs = core.runner.graphs
    out = graphs.forward_logits(core.runner.buffers.fill([], pad_to=8))
    assert out.shape == (8, core.config.vocab_size) and bool(torch.isfinite(out).all())
    for a, b in zip(caches(core), before):
        assert torch.equal(a, b)


def test_bucket_choice():
    assert padded_batch_sizes(1) == [1]
    assert padded_batch_sizes(8) == [1, 2, 4, 8]
    assert padded_batch_sizes(20) == [1, 2, 4, 8, 16, 24]
    assert padded_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    graphs = padded(make_core(load_model("synthetic-tiny", "int8"), max_running=20), "cpu").runner.graphs
    assert [graphs.bucket(b) for b in (1, 2, 3, 5, 8, 9, 16, 17, 24, 25)] == [1, 2, 4, 8, 8, 16, 16, 24, 24, None]


def test_padded_rows_and_fixed_width_tables(tiny):
    """A step of 3 decodes padded to 4: the padded row's fields, tables as wide as the context."""
    runner = padded(make_core(tiny, max_running=8), "cpu").runner
    chunks = [
        ScheduledChunk(make_request(f"r{i}", [2] * n), [7 + i], n - 1, [[i + 1, i + 2], [i + 3, None]], True)
        for i, n in enumerate((20, 5, 31))
    ]
    batch = runner.buffers.fill(chunks, pad_to=4)
    width = CONTEXT // 16
    assert batch.token_ids.tolist() == [7, 8, 9, 0] and batch.positions.tolist() == [19, 4, 30, 0]
    assert batch.seq_lens.tolist() == [20, 5, 31, 0] and batch.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert batch.row_seq.tolist() == [0, 1, 2, 3] and batch.sample_rows.tolist() == [0, 1, 2]
    assert [m.tolist()[3] for m in batch.slot_mappings] == [-1, -1]
    assert all(t.shape == (4, width) and t[3].tolist() == [0] * width for t in batch.block_tables)
    assert batch.block_tables[1][0].tolist() == [3, 0] + [0] * (width - 2)


def test_step_buffers_are_allocated_once(tiny):
    core = padded(make_core(tiny, budget=64, max_running=16, prefix_caching=False), "cpu")
    buffers = core.runner.buffers
    base = buffers.device_buffer.data_ptr()
    seen: list[tuple[int, int, int]] = []
    fill = buffers.fill

    def recorded(chunks, pad_to=None):
        batch = fill(chunks, pad_to)
        seen.append((pad_to or 0, batch.token_ids.data_ptr(), batch.block_tables[0].data_ptr()))
        return batch

    buffers.fill = recorded
    vocab = core.config.vocab_size
    logits_rows(core, requests(5, 4, vocab))
    assert buffers.device_buffer.data_ptr() == base and buffers.generation == 0
    by_bucket: dict[int, set[tuple[int, int]]] = {}
    for bucket, *ptrs in seen:
        if bucket:
            by_bucket.setdefault(bucket, set()).add(tuple(ptrs))
    assert by_bucket and all(len(p) == 1 for p in by_bucket.values())  # a bucket's fields never move
    assert sum(bucket == 8 for bucket, *_ in seen) >= 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replay_gives_the_eager_logits():
    """Capture at start-up, replay at decode steps: bit-equal to the eager unpadded path on the same GPU."""
    model_and_tok = load_model("synthetic-tiny", "int8", "cuda", kernels="triton")
    vocab = model_and_tok[0].config.vocab_size

    eager = make_core(model_and_tok, budget=4096, max_running=16, prefix_caching=False, device="cuda")
    eager.runner = ModelRunner(
        eager.model, eager.kv_cache, select_ops("cuda", "triton"), "cuda", max_num_running=16, cuda_graphs=False
    )
    want = logits_rows(eager, requests(9, 4, vocab))
    graphed = make_core(model_and_tok, budget=4096, max_running=16, prefix_caching=False, device="cuda")
    assert graphed.runner.graphs is not None and graphed.runner.graphs.captured == [1, 2, 4, 8, 16]
    got = logits_rows(graphed, requests(9, 4, vocab))
    for rid, rows in want.items():
        assert len(got[rid]) == len(rows) > 1
        for step, (a, b) in enumerate(zip(got[rid], rows)):
            assert torch.equal(a, b), f"{rid} step {step}: logits differ by {(a - b).abs().max().item():.3e}"
