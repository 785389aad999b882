"""An engine SIGKILLed mid-stream: the gateway resumes the reply on another engine, and the client
sees one stream with no token lost or repeated; the killed engine rejoins when it serves again."""

from __future__ import annotations

import signal

import pytest
from gateway_helpers import (
    ACME_KEY,
    MID_STREAM_TOKENS,
    auth,
    chat_request,
    chat_stub,
    collect,
    engine_request,
    engine_stub,
    gateway_metrics,
    metric_value,
    ring_owner,
    start_engine,
    start_engines,
    start_serving_gateway,
    wait_engines_serving,
)

ENGINE_IDS = ["e0", "e1"]


@pytest.fixture
def stack(tmp_path):
    engines = start_engines(ENGINE_IDS, tmp_path)
    gateway = None
    try:
        gateway = start_serving_gateway(engines, tmp_path)
        yield engines, gateway, tmp_path
    finally:
        if gateway is not None:
            gateway.stop()
        for engine in engines.values():
            engine.stop()


def test_sigkill_mid_stream_fails_over_without_loss_or_repeat(stack) -> None:
    engines, gateway, tmp_path = stack
    conv = "failover-dialogue"
    owner = ring_owner(ENGINE_IDS, conv)
    survivor = next(e for e in ENGINE_IDS if e != owner)
    request = chat_request(conv, max_new_tokens=MID_STREAM_TOKENS)

    # Reference: the same greedy request, uninterrupted, straight to the surviving engine.
    channel, direct = engine_stub(engines[survivor])
    with channel:
        reference_ids, reference_text, reference_final = collect(direct.Generate(engine_request(request), timeout=120))
    assert len(reference_ids) >= 20, "the reference reply must be long enough to cut"

    channel, stub = chat_stub(gateway)
    with channel:
        events = stub.Generate(request, metadata=auth(ACME_KEY), timeout=120)
        received = []
        for event in events:
            received.append(event)
            if sum(len(e.delta.token_ids) for e in received) >= 5:
                break
        engines[owner].signal(signal.SIGKILL)
        engines[owner].process.wait(10)
        received.extend(events)
    token_ids, text, final = collect(received)
    assert token_ids == reference_ids
    assert text == reference_text
    assert final.failovers == 1
    assert final.engine_id == survivor
    assert final.finish_reason == reference_final.finish_reason
    assert final.usage.generated_tokens == len(reference_ids)
    assert metric_value(gateway_metrics(gateway), "salon_gateway_failovers_total", from_engine=owner) == 1

    # The dead engine is out of the ring: its dialogues go to the survivor without a failover.
    wait_engines_serving(gateway, [owner], serving=False)
    channel, stub = chat_stub(gateway)
    with channel:
        _, _, f = collect(stub.Generate(chat_request(conv, 2), metadata=auth(ACME_KEY), timeout=60))
    assert (f.engine_id, f.failovers) == (survivor, 0)

    # It comes back on the same address and rejoins; new dialogues it owns go to it again.
    port = engines[owner].port
    engines[owner] = start_engine(owner, tmp_path, port=port)
    wait_engines_serving(gateway, [owner], timeout_s=60)
    new_conv = next(f"back-{i}" for i in range(1000) if ring_owner(ENGINE_IDS, f"back-{i}") == owner)
    channel, stub = chat_stub(gateway)
    with channel:
        _, _, f = collect(stub.Generate(chat_request(new_conv, 2), metadata=auth(ACME_KEY), timeout=60))
    assert f.engine_id == owner
