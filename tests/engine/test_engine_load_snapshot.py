"""The load the engine's admission reads (EngineLoop.num_waiting: the published snapshot plus requests submitted
since) is published before a step's events are sent (synthetic-tiny, in process): a client that got the first token
of a request finds it counted as running, not still waiting, so a full queue does not refuse its next request for
a request that has left the queue."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from salon.engine.core.engine_loop import EngineLoop
from salon.engine.worker.model_loading import load_model
from tests.engine_testlib import make_core, make_request, tokens

# How long the step thread takes over each snapshot here: far longer than the event loop takes to hand a sent
# event on, so an event sent before its step's snapshot always arrives first.
SLOW_SNAPSHOT_S = 0.3


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model("synthetic-tiny", "int8")


async def test_a_requests_first_token_comes_after_the_load_that_counts_it_running(model_and_tokenizer) -> None:
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
        events = loop.submit(make_request("r1", tokens(40, 1), 64))
        assert loop.num_waiting == 1  # submitted, in no snapshot yet
        while not (await asyncio.wait_for(events.get(), 60)).token_ids:
            pass
        assert loop.load.running_requests == 1
        assert loop.num_waiting == 0, "r1 has a token but still counts as waiting"
        loop.abort("r1")
    finally:
        await asyncio.to_thread(loop.stop)
