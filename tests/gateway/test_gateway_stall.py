"""A hung engine (SIGSTOP: its connections stay open and nothing answers) with real engines behind a real
gateway: a stream it was serving moves to the other engine on the inter-token timeout with exactly the
tokens of an undisturbed run; a new dialogue it owns is served by the other engine without waiting for
it; it leaves the gateway's ring while its load reports are stale, and after SIGCONT it rejoins and its
dialogues come back to it."""

from __future__ import annotations

import signal
import time

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
    start_engines,
    start_serving_gateway,
    wait_engines_serving,
)

ENGINE_IDS = ["e0", "e1"]
INTER_TOKEN_TIMEOUT_S = 1.0
STALE_AFTER_S = 1.0
FIRST_TOKEN_TIMEOUT_S = 1.5
# Scheduling slack on a busy test host; far below what a stopped engine costs without the bounds (the
# client's deadline, CLIENT_TIMEOUT_S).
MARGIN_S = 8.0
CLIENT_TIMEOUT_S = 40.0


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stall")
    procs = start_engines(ENGINE_IDS, tmp)
    try:
        yield procs, tmp
    finally:
        for proc in procs.values():
            proc.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            proc.stop()


def _gateway(engines, name: str, *flags: str):
    procs, tmp = engines
    return start_serving_gateway(procs, tmp, name, flags)


def _owned_by(engine_id: str, prefix: str) -> str:
    return next(f"{prefix}-{i}" for i in range(1000) if ring_owner(ENGINE_IDS, f"{prefix}-{i}") == engine_id)


def _served(gateway, conversation: str, max_new_tokens: int = 4):
    """One turn through the gateway: (final, seconds it took)."""
    channel, stub = chat_stub(gateway)
    with channel:
        started = time.monotonic()
        _, _, final = collect(
            stub.Generate(chat_request(conversation, max_new_tokens), metadata=auth(ACME_KEY), timeout=CLIENT_TIMEOUT_S)
        )
    return final, time.monotonic() - started


def _stopped(engine):
    """Context: the engine SIGSTOPped for the block, SIGCONTed after it whatever happens."""

    class _Stop:
        def __enter__(self):
            engine.signal(signal.SIGSTOP)

        def __exit__(self, *exc):
            engine.signal(signal.SIGCONT)

    return _Stop()


def test_stream_on_a_stopped_engine_fails_over_on_the_inter_token_timeout(engines) -> None:
    procs, _ = engines
    gateway = _gateway(
        engines,
        "gw-inter",
        "--inter-token-timeout-s",
        str(INTER_TOKEN_TIMEOUT_S),
        "--engine-stale-after-s",
        str(STALE_AFTER_S),
    )
    try:
        conversation = "stall-mid-stream"
        owner = ring_owner(ENGINE_IDS, conversation)
        survivor = next(e for e in ENGINE_IDS if e != owner)
        request = chat_request(conversation, max_new_tokens=MID_STREAM_TOKENS)
        # Exactly MID_STREAM_TOKENS tokens: a reply cut short by its end of turn could be whole before the stop.
        request.sampling.ignore_eos = True
        # Reference: the same greedy request, undisturbed, straight to the surviving engine.
        channel, direct = engine_stub(procs[survivor])
        with channel:
            reference_ids, reference_text, reference_final = collect(
                direct.Generate(engine_request(request), timeout=120)
            )
        assert len(reference_ids) == MID_STREAM_TOKENS

        channel, stub = chat_stub(gateway)
        with channel:
            events = stub.Generate(request, metadata=auth(ACME_KEY), timeout=CLIENT_TIMEOUT_S)
            received = []
            for event in events:
                received.append(event)
                if sum(len(e.delta.token_ids) for e in received) >= 5:
                    break
            with _stopped(procs[owner]):
                longest_gap_s, last_s = 0.0, time.monotonic()
                for event in events:
                    now = time.monotonic()
                    longest_gap_s, last_s = max(longest_gap_s, now - last_s), now
                    received.append(event)
        token_ids, text, final = collect(received)
        assert token_ids == reference_ids
        assert text == reference_text
        assert (final.failovers, final.engine_id) == (1, survivor)
        assert final.finish_reason == reference_final.finish_reason
        assert final.usage.generated_tokens == len(reference_ids)
        assert INTER_TOKEN_TIMEOUT_S <= longest_gap_s < INTER_TOKEN_TIMEOUT_S + MARGIN_S
        text = gateway_metrics(gateway)
        assert metric_value(text, "salon_gateway_stream_stalls_total", engine=owner, kind="inter_token") == 1
        assert metric_value(text, "salon_gateway_failovers_total", from_engine=owner) == 1
        # Running again, the engine rejoins the ring.
        wait_engines_serving(gateway, [owner], timeout_s=30)
    finally:
        gateway.stop()


def test_stopped_engine_leaves_the_ring_and_rejoins_with_its_dialogues(engines) -> None:
    procs, _ = engines
    # The first-token bound is far off: only the engine's silence can move these dialogues quickly.
    gateway = _gateway(
        engines, "gw-stale", "--engine-stale-after-s", str(STALE_AFTER_S), "--first-token-timeout-s", "120"
    )
    try:
        owner, survivor = ENGINE_IDS
        kept = _owned_by(owner, "kept")
        final, _ = _served(gateway, kept)
        assert final.engine_id == owner
        with _stopped(procs[owner]):
            # No stream touches it: its stale load reports alone take it out of the gateway's ring.
            wait_engines_serving(gateway, [owner], serving=False, timeout_s=STALE_AFTER_S + MARGIN_S)
            assert metric_value(gateway_metrics(gateway), "salon_gateway_engine_stale_total", engine=owner) == 1
            wait_engines_serving(gateway, [survivor])
            # Out of the ring, it is not even tried: no failover, no wait.
            final, _ = _served(gateway, _owned_by(owner, "new"))
            assert (final.engine_id, final.failovers) == (survivor, 0)
        # Running again, it reports again and rejoins; the dialogue it held returns to it (its session still
        # names it) and new dialogues it owns go to it.
        wait_engines_serving(gateway, [owner], timeout_s=30)
        final, _ = _served(gateway, kept)
        assert (final.engine_id, final.failovers) == (owner, 0)
        final, _ = _served(gateway, _owned_by(owner, "after"))
        assert final.engine_id == owner
        # Stopped again, a new dialogue it owns sent at once (most likely before the gateway noticed) is
        # served by the other engine as soon as the silence shows, not after the first-token bound.
        with _stopped(procs[owner]):
            final, elapsed_s = _served(gateway, _owned_by(owner, "at-once"))
            assert final.engine_id == survivor
            assert elapsed_s < STALE_AFTER_S + MARGIN_S
        wait_engines_serving(gateway, [owner], timeout_s=30)
    finally:
        gateway.stop()


def test_first_token_timeout_moves_a_new_reply_off_a_stopped_engine(engines) -> None:
    """With staleness off, only the first-token bound notices the stopped engine."""
    procs, _ = engines
    gateway = _gateway(
        engines, "gw-first", "--engine-stale-after-s", "0", "--first-token-timeout-s", str(FIRST_TOKEN_TIMEOUT_S)
    )
    try:
        owner, survivor = ENGINE_IDS
        conversation = _owned_by(owner, "first")
        with _stopped(procs[owner]):
            final, elapsed_s = _served(gateway, conversation)
        assert (final.engine_id, final.failovers) == (survivor, 1)
        assert FIRST_TOKEN_TIMEOUT_S <= elapsed_s < FIRST_TOKEN_TIMEOUT_S + MARGIN_S
        text = gateway_metrics(gateway)
        assert metric_value(text, "salon_gateway_stream_stalls_total", engine=owner, kind="first_token") == 1
        wait_engines_serving(gateway, [owner], timeout_s=30)
    finally:
        gateway.stop()
