"""The load the engine's admission reads (EngineLoop.num_waiting: the published snapshot plus requests submitted
since) is published before a step's events are sent and before an abort is answered (synthetic-tiny, in process): a
client that got the first token of a request finds it counted as running, not still waiting, and one whose waiting
request was aborted finds it gone, so a full queue does not refuse the client's next request for a request that has
left the queue."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest

from salon.engine.core.engine_loop import EngineLoop
from salon.engine.request import FinishReason
from salon.engine.worker.model_loading import load_model
from tests.engine_testlib import make_core, make_request, tokens

# How long the step thread takes over each snapshot here: far longer than the event loop takes to hand a sent
# event on, so an event sent before its step's snapshot always arrives first.
SLOW_SNAPSHOT_S = 0.3


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model("synthetic-tiny", "int8")


@contextlib.asynccontextmanager
async def _loop_with_slow_snapshots(model_and_tokenizer):
    """A running EngineLoop (one request running, one waiting at most) whose step thread takes SLOW_SNAPSHOT_S over
    each load snapshot."""
    core = make_core(model_and_tokenizer, max_running=1, max_waiting=1)
    loop = EngineLoop(core, asyncio.get_running_loop())
    real_load = core.load

    def slow_load(*args, **kwargs):
        if threading.current_thread().name == "engine-step-loop":
            time.sleep(SLOW_SNAPSHOT_S)
        return real_load(*args, **kwargs)

    core.load = slow_load
    loop.start()
    try:
        yield loop
    finally:
        await asyncio.to_thread(loop.stop)


async def _first_token(events: asyncio.Queue) -> None:
    while not (await asyncio.wait_for(events.get(), 60)).token_ids:
        pass


async def test_a_requests_first_token_comes_after_the_load_that_counts_it_running(model_and_tokenizer) -> None:
    async with _loop_with_slow_snapshots(model_and_tokenizer) as loop:
        events = loop.submit(make_request("r1", tokens(40, 1), 64))
        assert loop.num_waiting == 1  # submitted, in no snapshot yet
        await _first_token(events)
        assert loop.load.running_requests == 1
        assert loop.num_waiting == 0, "r1 has a token but still counts as waiting"
        loop.abort("r1")


async def test_an_aborted_waiting_requests_end_comes_after_the_load_without_it(model_and_tokenizer) -> None:
    async with _loop_with_slow_snapshots(model_and_tokenizer) as loop:
        await _first_token(loop.submit(make_request("r1", tokens(40, 1), 4096)))
        waiting = loop.submit(make_request("r2", tokens(40, 2), 8))
        deadline = time.monotonic() + 60
        while loop.load.waiting_requests != 1:  # r2 queued behind r1, in a published snapshot
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert loop.abort("r2")
        while (event := await asyncio.wait_for(waiting.get(), 60)).finish_reason is None:
            pass
        assert event.finish_reason is FinishReason.ABORTED
        assert loop.load.waiting_requests == 0 and loop.num_waiting == 0, "r2 ended but still counts as waiting"
        loop.abort("r1")
