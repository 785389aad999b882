"""The scheduler with no model: admission, chunking and the exact preemption order.

A one-layer all-global config with 4-token blocks and a 6-block pool; "computing" a step means
recording its chunks and appending one output token to every sampled request.
"""

from __future__ import annotations

import pytest

from salon.engine.batch import SchedulerOutput
from salon.engine.config import SchedulerConfig
from salon.engine.core.scheduler import Scheduler
from salon.engine.kv.kv_cache_manager import KVCacheManager
from salon.engine.kv.kv_layout import plan_layout
from salon.engine.model.config import LayerSpec, ModelConfig
from salon.engine.request import Request, RequestId, RequestStatus, SamplingParams

BS = 4
OUTPUT_TOKEN = 7


def one_layer_config() -> ModelConfig:
    return ModelConfig(
        model_id="scheduler-test",
        vocab_size=100,
        d_model=8,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=4,
        ffn_dim=8,
        rms_norm_eps=1e-6,
        max_context_tokens=1024,
        bos_token_id=1,
        eos_token_ids=(2,),
        layers=(LayerSpec("global", None, 10_000.0),),
    )


def make_scheduler(
    num_blocks: int,
    budget: int = 64,
    max_running: int = 8,
    long_prefill_tokens: int = 64,
    long_prefill_solo_tokens: int = 0,
) -> Scheduler:
    cfg = one_layer_config()
    page = plan_layout(cfg, BS, 1 << 20).page_bytes
    kv = KVCacheManager(plan_layout(cfg, BS, num_blocks * page))
    return Scheduler(
        SchedulerConfig(
            budget, max_running, 16, long_prefill_tokens, long_prefill_solo_tokens=long_prefill_solo_tokens
        ),
        kv,
    )


def request(rid: str, num_prompt_tokens: int, arrival_s: float, priority: int = 0) -> Request:
    return Request(
        RequestId(rid),
        [1] * num_prompt_tokens,
        SamplingParams(max_new_tokens=100),
        frozenset(),
        1024,
        arrival_s=arrival_s,
        priority=priority,
    )


def step(scheduler: Scheduler) -> SchedulerOutput:
    output = scheduler.schedule()
    scheduler.on_computed(output)
    for chunk in output.chunks:
        if chunk.needs_sample:
            chunk.request.output_token_ids.append(OUTPUT_TOKEN)
    return output


def chunks(output: SchedulerOutput) -> list[tuple[str, int, int]]:
    return [(c.request.request_id, c.start_position, c.num_tokens) for c in output.chunks]


def test_newest_running_request_is_preempted_first_and_requeued_by_arrival():
    s = make_scheduler(num_blocks=6)
    a, b, c = request("a", 8, 0.0), request("b", 8, 1.0), request("c", 4, 2.0)
    for r in (a, b, c):
        s.add(r)
    kv = s.kv

    out = step(s)  # everything fits: 2 + 2 + 1 blocks
    assert chunks(out) == [("a", 0, 8), ("b", 0, 8), ("c", 0, 4)] and out.preempted == []
    assert [kv.block_tables(r) for r in "abc"] == [[[0, 1]], [[2, 3]], [[4]]]

    out = step(s)  # a takes the last free block; b needs one more: c, the newest, is preempted
    assert chunks(out) == [("a", 8, 1), ("b", 8, 1)] and out.preempted == ["c"]
    assert kv.block_tables("a") == [[0, 1, 5]] and kv.block_tables("b") == [[2, 3, 4]]
    assert c.status is RequestStatus.WAITING and c.num_computed_tokens == 0 and c.num_preemptions == 1
    assert c.output_token_ids == [OUTPUT_TOKEN]  # kept: recomputed as part of its prompt when readmitted

    for _ in range(3):  # a and b fill their third blocks; c (5 tokens, 2 blocks) cannot come back
        out = step(s)
        assert [r for r, _, _ in chunks(out)] == ["a", "b"] and out.preempted == []

    out = step(s)  # a needs a fourth block: b is now the newest running request
    assert chunks(out) == [("a", 12, 1)] and out.preempted == ["b"]
    assert kv.block_tables("a") == [[0, 1, 5, 4]]  # b's blocks were freed tail first: 4, 3, 2
    assert kv.num_free_blocks == 2
    # Back in the queue by arrival: b (1.0) ahead of c (2.0); neither fits yet, nothing is admitted.
    assert [r.request_id for r in s.waiting] == ["b", "c"]
    assert s.num_preemptions == 2

    s.remove(a)  # a finishes: b is readmitted first and recomputes its 13 tokens in one chunk
    out = step(s)
    assert chunks(out)[0] == ("b", 0, 13)
    assert [r.request_id for r in s.running] == ["b", "c"]


def test_chunked_prefill_shares_the_budget_with_decodes_oldest_first():
    s = make_scheduler(num_blocks=64, budget=10)
    a, b = request("a", 12, 0.0), request("b", 30, 1.0)
    s.add(a)
    s.add(b)
    assert chunks(step(s)) == [("a", 0, 10)]
    assert chunks(step(s)) == [("a", 10, 2), ("b", 0, 8)]  # a's tail is sampled; b's prefill starts
    assert chunks(step(s)) == [("a", 12, 1), ("b", 8, 9)]  # a decodes, b takes the rest of the budget
    out = step(s)
    assert chunks(out) == [("a", 13, 1), ("b", 17, 9)] and not out.chunks[1].needs_sample
    out = step(s)
    assert chunks(out) == [("a", 14, 1), ("b", 26, 4)] and out.chunks[1].needs_sample


def test_no_admission_past_the_running_limit():
    s = make_scheduler(num_blocks=64, max_running=2)
    for i in range(3):
        s.add(request(f"r{i}", 4, float(i)))
    assert [r for r, _, _ in chunks(step(s))] == ["r0", "r1"]
    assert [r.request_id for r in s.waiting] == ["r2"]


def test_waiting_requests_are_admitted_by_priority_then_arrival():
    s = make_scheduler(num_blocks=64, max_running=1)
    s.add(request("busy", 4, 0.0))
    assert [r for r, _, _ in chunks(step(s))] == ["busy"]
    for rid, arrival, priority in (("low", 1.0, 5), ("first", 2.0, 0), ("urgent", 3.0, -3), ("second", 4.0, 0)):
        s.add(request(rid, 4, arrival, priority))
    assert [r.request_id for r in s.waiting] == ["urgent", "first", "second", "low"]
    admitted = []
    for _ in range(4):
        s.remove(s.running[0])
        admitted.append(chunks(step(s))[0][0])
    assert admitted == ["urgent", "first", "second", "low"]


def test_a_preempted_request_requeues_behind_higher_priorities():
    s = make_scheduler(num_blocks=2, max_running=2)
    a, b = request("a", 4, 0.0, priority=1), request("b", 4, 1.0, priority=1)
    s.add(a)
    s.add(b)
    step(s)
    s.add(request("c", 4, 2.0, priority=0))  # waits: the running limit
    out = step(s)  # a needs a second block: b (newest) is preempted and queued behind c's higher priority
    assert out.preempted == ["b"] and [r.request_id for r in s.waiting] == ["c", "b"]


def test_a_short_prefill_goes_first_and_the_long_one_shares_a_step_with_it_up_to_the_cap():
    s = make_scheduler(num_blocks=256, budget=256, long_prefill_tokens=64)
    long, short = request("long", 900, 0.0), request("short", 30, 1.0)
    s.add(long)
    assert chunks(step(s)) == [("long", 0, 256)]  # alone: a long prefill takes the whole budget
    s.add(short)
    # The short one whole (30), then the long one up to the cap's worth of the step's prefill tokens (64 - 30).
    assert chunks(step(s)) == [("short", 0, 30), ("long", 256, 34)]
    assert chunks(step(s)) == [("short", 30, 1), ("long", 290, 64)]  # beside a decode: the cap
    s.remove(short)
    assert chunks(step(s)) == [("long", 354, 256)]  # alone again: the whole budget


def test_long_prefills_go_in_arrival_order_and_interactive_ones_pass_them():
    s = make_scheduler(num_blocks=256, budget=100, long_prefill_tokens=16)
    a, b, c = request("a", 250, 0.0), request("b", 150, 1.0), request("c", 10, 2.0)
    for r in (a, b, c):
        s.add(r)
    # c (10 tokens) is interactive: admitted first although it came last; a, the oldest long prefill, takes
    # the rest of the cap (16 - 10); b waits its turn.
    assert chunks(step(s)) == [("c", 0, 10), ("a", 0, 6)]
    assert [r.request_id for r in s.waiting] == ["b"]
    assert chunks(step(s)) == [("c", 10, 1), ("a", 6, 16)]
    s.remove(c)
    # Long prefills alone: the budget in arrival order, a first, and b (admitted now) after it.
    assert chunks(step(s)) == [("a", 22, 100)]
    assert chunks(step(s)) == [("a", 122, 100)]
    assert chunks(step(s)) == [("a", 222, 28), ("b", 0, 72)]  # a stays long to its last chunk
    assert chunks(step(s)) == [("a", 250, 1), ("b", 72, 16)]  # a decodes: b gets the cap


@pytest.mark.parametrize(
    "long_tokens,back_tokens",
    [
        # long has 36 left after its first chunk (they would fit the budget): its last chunk is no reason to go first
        pytest.param(100, 20, id="the_last_chunk_of_a_long_prefill_does_not_go_first"),
        # back's 40 new tokens are more than the cap, but they fit the budget
        pytest.param(500, 40, id="a_returning_turn_longer_than_the_cap_still_passes"),
    ],
)
def test_a_returning_turn_that_fits_the_budget_passes_a_long_prefill(long_tokens, back_tokens):
    s = make_scheduler(num_blocks=256, budget=64, long_prefill_tokens=8)
    long, back = request("long", long_tokens, 0.0), request("back", back_tokens, 1.0)
    s.add(long)
    assert chunks(step(s)) == [("long", 0, 64)]
    s.add(back)  # back goes first, whole; long gets no share of a step whose interactive prefill passes the cap
    assert chunks(step(s)) == [("back", 0, back_tokens)]
    assert chunks(step(s)) == [("back", back_tokens, 1), ("long", 64, 8)]


def test_long_prefills_alone_take_the_solo_cap_so_a_returning_turn_waits_for_a_short_step():
    s = make_scheduler(num_blocks=256, budget=128, long_prefill_tokens=16, long_prefill_solo_tokens=48)
    a, b = request("a", 130, 0.0), request("b", 300, 1.0)
    s.add(a)
    s.add(b)
    # Alone, long prefills share the solo cap in arrival order: a's 130 tokens go in 48-token steps, then b
    # takes what a's last chunk leaves.
    assert chunks(step(s)) == [("a", 0, 48)]
    assert chunks(step(s)) == [("a", 48, 48)]
    assert chunks(step(s)) == [("a", 96, 34), ("b", 0, 14)]
    back = request("back", 100, 2.0)  # more than either cap, within the budget: interactive, whole
    s.add(back)
    assert chunks(step(s)) == [("a", 130, 1), ("back", 0, 100)]
    assert chunks(step(s)) == [("a", 131, 1), ("back", 100, 1), ("b", 14, 16)]  # beside decodes: the cap
    s.remove(a)
    s.remove(back)
    assert chunks(step(s)) == [("b", 30, 48)]  # alone again: the solo cap


def test_the_solo_cap_is_off_with_the_classes():
    s = make_scheduler(num_blocks=256, budget=256, long_prefill_tokens=0, long_prefill_solo_tokens=48)
    s.add(request("long", 900, 0.0))
    assert chunks(step(s)) == [("long", 0, 256)]  # arrival order, each step filled


def test_without_the_cap_the_short_prefill_waits_for_the_long_one():
    s = make_scheduler(num_blocks=256, budget=256, long_prefill_tokens=0)
    long, short = request("long", 900, 0.0), request("short", 30, 1.0)
    s.add(long)
    step(s)
    s.add(short)
    assert chunks(step(s)) == [("long", 256, 256)]
