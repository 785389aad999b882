"""Faults with real processes behind a real gateway, each followed by the engines' own leak check.

Already covered elsewhere (not repeated here): a single stream failing over after SIGKILL with no token
lost or repeated (tests/gateway/test_gateway_failover.py), kvstore killed/restarted and SIGSTOPped
(tests/crossturn/test_crossturn_processes.py), Redis restart/down (tests/gateway/test_gateway_service.py).
Here: many streams in flight when faults hit, then free + cached == total KV blocks and no open stream.
"""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest
from hardening_stack import (
    KEY_A,
    assert_engine_clean,
    assert_gateway_clean,
    auth,
    chat_request,
    chat_stub,
    collect,
    engine_load,
    start_engine,
    start_gateway,
    stop_all,
    wait_gateway_sees,
    write_tenants,
)

ENGINE_IDS = ("e0", "e1")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    engines, gateway = {}, None
    try:
        for engine_id in ENGINE_IDS:
            engines[engine_id] = start_engine(engine_id, tmp)
        gateway = start_gateway(engines, write_tenants(tmp / "tenants.json"), tmp)
        wait_gateway_sees(gateway, len(engines))
        yield engines, gateway
    finally:
        stop_all([gateway, *engines.values()])


def _first_events(calls) -> None:
    for call in calls:
        event = next(call)
        assert event.HasField("delta")


def test_bulk_client_cancel_leaks_nothing(stack) -> None:
    engines, gateway = stack
    channel, stub = chat_stub(gateway.address)
    with channel:
        calls = [
            stub.Generate(chat_request(f"bulk-cancel-{i}", max_new_tokens=3000), metadata=auth(KEY_A), timeout=60)
            for i in range(16)
        ]
        _first_events(calls)
        for call in calls:
            call.cancel()
        for call in calls:
            assert call.code() == grpc.StatusCode.CANCELLED
    for engine in engines.values():
        assert_engine_clean(engine, timeout_s=10)
    assert_gateway_clean(gateway)


def test_stalled_engine_costs_a_deadline_not_a_hang(stack) -> None:
    """SIGSTOP the engine mid-stream: the client's deadline ends the call on time; after SIGCONT the
    engine drops the expired work and leaks nothing."""
    engines, gateway = stack
    channel, stub = chat_stub(gateway.address)
    with channel:
        call = stub.Generate(chat_request("stall-me", max_new_tokens=3000), metadata=auth(KEY_A), timeout=3.0)
        first = next(call)
        assert first.HasField("delta")
        owner = engines[_engine_of(engines)]
        owner.signal(signal.SIGSTOP)
        started = time.monotonic()
        try:
            with pytest.raises(grpc.RpcError) as info:
                collect(call)
            elapsed_s = time.monotonic() - started
        finally:
            owner.signal(signal.SIGCONT)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert elapsed_s < 5.0
    for engine in engines.values():
        assert_engine_clean(engine, timeout_s=15)
    assert_gateway_clean(gateway)


def _engine_of(engines, timeout_s: float = 1.0) -> str:
    """Which engine serves a running stream: the one whose load shows a running request (a stream's first token
    can reach the client before the engine publishes the load of the step that made it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = [eid for eid, e in engines.items() if engine_load(e.address).running_requests > 0]
        if busy or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert len(busy) == 1, busy
    return busy[0]


def test_engine_killed_with_many_streams_in_flight(stack) -> None:
    """SIGKILL one engine while 8 streams run on both: every stream ends with exactly the tokens of an
    undisturbed run of the same request (failover resumes, nothing lost or repeated), the survivor's
    accounting is clean, the gateway holds no stream."""
    engines, gateway = stack
    budget = 1000  # seconds of decoding after every stream's first token: the kill lands mid-stream
    channel, stub = chat_stub(gateway.address)
    with channel:  # the reference: the same greedy request, served without a fault
        reference = collect(
            stub.Generate(chat_request("kill-reference", max_new_tokens=budget), metadata=auth(KEY_A), timeout=120)
        )
    results: dict[int, object] = {}
    started = threading.Barrier(9)

    def run(i: int) -> None:
        channel, stub = chat_stub(gateway.address)
        with channel:
            try:
                call = stub.Generate(
                    chat_request(f"kill-{i}", max_new_tokens=budget), metadata=auth(KEY_A), timeout=120
                )
                events = [next(call)]
                started.wait(30)
                events.extend(call)
                results[i] = collect(events)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    started.wait(60)
    victim = engines["e0"]
    assert engine_load(victim.address).running_requests > 0, "no stream runs on the engine about to be killed"
    victim.signal(signal.SIGKILL)
    victim.process.wait(10)
    for t in threads:
        t.join(120)
    failures = {i: r for i, r in results.items() if isinstance(r, Exception)}
    assert not failures
    assert len(results) == 8
    for reply in results.values():
        assert reply.final is not None
        # The stream's own tokens, not the gateway's count of them: equal to the undisturbed run's.
        assert reply.token_ids == reference.token_ids
        assert reply.final.usage.generated_tokens == len(reply.token_ids) <= budget
    assert any(r.final.failovers == 1 for r in results.values()), "no stream was on the killed engine"
    assert all(r.final.engine_id == "e1" for r in results.values() if r.final.failovers)
    assert_engine_clean(engines["e1"], timeout_s=10)
    assert_gateway_clean(gateway)
