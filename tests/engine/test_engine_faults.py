"""Faults stay local (synthetic-tiny, in process): malformed kvstore KV fails only its own request, a
failing step fails only the requests of that step, and when the step itself cannot go on the loop
says so (on_fatal) and refuses work instead of running on with a dead step thread."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from salon.common.kvstore_contract.client import FetchResult
from salon.engine.core.engine_loop import MAX_CONSECUTIVE_STEP_FAILURES, EngineDead, EngineLoop
from salon.engine.kv.kv_transfer import host_layout
from salon.engine.prefix.hit import host_hit
from salon.engine.prefix.host_cache import HostCache
from salon.engine.request import FinishReason
from salon.engine.worker.model_loading import load_model
from tests.engine_testlib import blocks_accounted, make_core, make_request, run, tokens


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model("synthetic-tiny", "int8")


def test_malformed_kvstore_kv_fails_only_its_request(model_and_tokenizer) -> None:
    reference, _ = run(make_core(model_and_tokenizer), [make_request("good", tokens(60, 1), 8)])
    core = make_core(model_and_tokenizer, budget=512)
    bad_hit = host_hit(32, torch.zeros((2, 3), dtype=torch.uint8), torch.zeros((0, 3), dtype=torch.uint8), 2)
    out, finish = run(
        core,
        [make_request("good", tokens(60, 1), 8), make_request("bad", tokens(60, 2), 8, namespace=b"n" * 32)],
        {"bad": bad_hit},
    )
    assert finish == {"good": FinishReason.LENGTH, "bad": FinishReason.ERROR}
    assert out["good"] == reference["good"] and out["bad"] == []
    assert blocks_accounted(core) and not core.has_work()


def test_the_host_cache_turns_a_reply_of_the_wrong_shape_into_a_miss(model_and_tokenizer) -> None:
    core = make_core(model_and_tokenizer)
    layout = host_layout(core.layout)
    cache = HostCache(client=None, layout=layout)  # _to_hit only looks at the fetched arrays
    g, lw = layout.global_bytes_per_block, max(layout.local_bytes_per_block, 1)
    local_from = 2 - layout.needed_local_blocks(2)

    def fetched(
        num_tokens=32,
        global_rows=2,
        global_width=g,
        local_rows=2 - local_from,
        local_width=lw,
        local_from_block=local_from,
        dtype=np.uint8,
    ):
        return FetchResult(
            num_tokens,
            0,
            np.zeros((global_rows, global_width), dtype),
            local_from_block,
            np.zeros((local_rows, local_width), dtype),
            "grpc",
        )

    assert cache._to_hit(fetched()) is not None
    for bad in (
        fetched(global_width=g - 1),
        fetched(global_rows=1),
        fetched(num_tokens=31),
        fetched(dtype=np.int16),
        fetched(local_rows=3 - local_from),
    ):
        assert cache._to_hit(bad) is None
    if layout.sliding_window_tokens:
        assert cache._to_hit(fetched(local_width=lw + 1)) is None


def _events_until_done(events: asyncio.Queue):
    async def drain():
        out = []
        while True:
            event = await events.get()
            out.append(event)
            if event.finish_reason is not None:
                return out

    return drain()


async def test_a_failing_step_fails_its_requests_and_the_loop_goes_on(model_and_tokenizer) -> None:
    core = make_core(model_and_tokenizer, max_running=1)
    real = core.runner.execute
    poisoned = {"p"}

    def execute(output):
        if any(c.request.request_id in poisoned for c in output.chunks):
            raise RuntimeError("step failed")
        return real(output)

    core.runner.execute = execute
    fatal: list[str] = []
    loop = EngineLoop(core, asyncio.get_running_loop(), on_fatal=fatal.append)
    loop.start()
    try:
        poison = loop.submit(make_request("p", tokens(40, 3), 6))
        waiting = loop.submit(make_request("w", tokens(40, 4), 6))  # queued behind p (one running at a time)
        p_events = await asyncio.wait_for(_events_until_done(poison), 60)
        w_events = await asyncio.wait_for(_events_until_done(waiting), 60)
        assert p_events[-1].finish_reason is FinishReason.ERROR and "engine step" in p_events[-1].error
        assert w_events[-1].finish_reason is FinishReason.LENGTH
        assert sum(len(e.token_ids) for e in w_events) == 6
        assert not fatal and loop.dead is None
    finally:
        await asyncio.to_thread(loop.stop)
    assert blocks_accounted(core)


async def test_a_step_that_cannot_go_on_stops_the_loop_and_says_so(model_and_tokenizer) -> None:
    core = make_core(model_and_tokenizer)

    def broken(output):
        raise RuntimeError("the model is gone")

    core.runner.execute = broken
    fatal: list[str] = []
    loop = EngineLoop(core, asyncio.get_running_loop(), on_fatal=fatal.append)
    loop.start()
    try:
        for i in range(MAX_CONSECUTIVE_STEP_FAILURES):
            events = loop.submit(make_request(f"r{i}", tokens(30, i), 4))
            last = (await asyncio.wait_for(_events_until_done(events), 60))[-1]
            assert last.finish_reason is FinishReason.ERROR
        for _ in range(100):
            if fatal:
                break
            await asyncio.sleep(0.05)
        assert fatal and "cannot go on" in fatal[0] and loop.dead is not None
        with pytest.raises(EngineDead):
            loop.submit(make_request("late", tokens(30, 9), 4))
        with pytest.raises(EngineDead):
            await loop.purge(None, "c")
    finally:
        await asyncio.to_thread(loop.stop)


async def test_an_error_no_request_explains_is_fatal_at_once(model_and_tokenizer) -> None:
    core = make_core(model_and_tokenizer)

    def broken_schedule():
        raise RuntimeError("scheduler state is broken")

    fatal: list[str] = []
    loop = EngineLoop(core, asyncio.get_running_loop(), on_fatal=fatal.append)
    core.scheduler.schedule = broken_schedule
    loop.start()
    try:
        events = loop.submit(make_request("a", tokens(30, 1), 4))
        last = (await asyncio.wait_for(_events_until_done(events), 60))[-1]
        assert last.finish_reason is FinishReason.ERROR and last.error == "the engine is restarting"
        for _ in range(100):
            if fatal:
                break
            await asyncio.sleep(0.05)
        assert fatal and "scheduler state is broken" in fatal[0]
    finally:
        await asyncio.to_thread(loop.stop)
