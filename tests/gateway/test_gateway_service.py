"""The gateway as a real process in front of real engine processes (synthetic model) on loopback."""

from __future__ import annotations

import time

import grpc
import pytest
from gateway_helpers import (  # noqa: F401 - redis_server is a fixture
    ACME_KEY,
    GLOBEX_KEY,
    MID_STREAM_TOKENS,
    auth,
    chat_request,
    chat_stub,
    collect,
    engine_request,
    engine_stub,
    gateway_metrics,
    metric_value,
    redis_server,
    ring_owner,
    start_engines,
    start_gateway,
    wait_engines_serving,
    write_tenants,
)

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2

ENGINE_IDS = ["e0", "e1", "e2"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("gateway")


@pytest.fixture(scope="module")
def engines(workdir):
    procs = start_engines(ENGINE_IDS, workdir)
    try:
        yield procs
    finally:
        for p in procs.values():
            p.stop()


@pytest.fixture(scope="module")
def tenants_file(workdir):
    return write_tenants(workdir / "tenants.json")


@pytest.fixture(scope="module")
def gateway(engines, tenants_file, workdir):
    proc = start_gateway(engines.values(), tenants_file, workdir)
    try:
        wait_engines_serving(proc, ENGINE_IDS)
        yield proc
    finally:
        proc.stop()


def engine_load(engine) -> engine_pb2.LoadReport:
    channel, stub = engine_stub(engine)
    with channel:
        return stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=5).load


def wait_idle(engine, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        report = engine_load(engine)
        if report.running_requests == 0 and report.waiting_requests == 0:
            return
        assert time.monotonic() < deadline, f"engine still busy: {report}"
        time.sleep(0.05)


def test_stream_matches_direct_engine_and_is_sticky(gateway, engines) -> None:
    request = chat_request("dialogue-sticky", max_new_tokens=12, request_id="req-1")
    channel, stub = chat_stub(gateway)
    with channel:
        token_ids, text, final = collect(stub.Generate(request, metadata=auth(ACME_KEY), timeout=60))
        owner = ring_owner(ENGINE_IDS, "dialogue-sticky")
        assert final.engine_id == owner
        assert (final.request_id, final.failovers) == ("req-1", 0)
        assert final.usage.generated_tokens == len(token_ids) > 0
        # The same greedy request straight to the engine gives the same tokens and text.
        direct_channel, direct = engine_stub(engines[owner])
        with direct_channel:
            direct_ids, direct_text, _ = collect(direct.Generate(engine_request(request), timeout=60))
        assert (token_ids, text) == (direct_ids, direct_text)
        # Later turns of the dialogue stay on the same engine.
        for _ in range(3):
            _, _, again = collect(
                stub.Generate(chat_request("dialogue-sticky", 2), metadata=auth(ACME_KEY), timeout=60)
            )
            assert again.engine_id == owner
        # Dialogues spread over the engines by the ring.
        seen = set()
        for i in range(12):
            conv = f"spread-{i}"
            _, _, f = collect(stub.Generate(chat_request(conv, 1), metadata=auth(ACME_KEY), timeout=60))
            assert f.engine_id == ring_owner(ENGINE_IDS, conv)
            seen.add(f.engine_id)
        assert seen == set(ENGINE_IDS)
    text_metrics = gateway_metrics(gateway)
    assert metric_value(text_metrics, "salon_gateway_route_decisions_total", outcome="sticky") >= 3
    assert metric_value(text_metrics, "salon_gateway_requests_total", tenant="acme", code="OK") >= 16


def test_model_info_forwarded(gateway) -> None:
    channel, stub = chat_stub(gateway)
    with channel:
        info = stub.GetModelInfo(chat_pb2.GetModelInfoRequest(), metadata=auth(ACME_KEY), timeout=10)
    assert info.model.model_id and info.model.vocab_size > 0


@pytest.mark.parametrize(
    "metadata, code",
    [
        ((), grpc.StatusCode.UNAUTHENTICATED),
        (auth("not-a-known-key-123"), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", f"Basic {ACME_KEY}"),), grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_unknown_api_key_is_unauthenticated(gateway, metadata, code) -> None:
    channel, stub = chat_stub(gateway)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(chat_request("x"), metadata=metadata, timeout=10))
        assert info.value.code() == code
        assert "authorization" in info.value.details()
        assert ACME_KEY not in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            stub.GetModelInfo(chat_pb2.GetModelInfoRequest(), metadata=metadata, timeout=10)
        assert info.value.code() == code


@pytest.mark.parametrize(
    "request_, field",
    [
        (chat_pb2.GenerateRequest(tokens=chat_pb2.TokenizedPrompt(token_ids=[2])), "conversation_id"),
        (
            chat_pb2.GenerateRequest(conversation_id="x" * 257, tokens=chat_pb2.TokenizedPrompt(token_ids=[2])),
            "conversation_id",
        ),
        (chat_pb2.GenerateRequest(conversation_id="x"), "context"),
        (chat_pb2.GenerateRequest(conversation_id="x", tokens=chat_pb2.TokenizedPrompt()), "tokens.token_ids"),
        (chat_pb2.GenerateRequest(conversation_id="x", dialogue=chat_pb2.Dialogue()), "dialogue.messages"),
    ],
)
def test_bad_request_names_the_field(gateway, request_, field) -> None:
    channel, stub = chat_stub(gateway)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(request_, metadata=auth(ACME_KEY), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(field)


def test_tenant_stream_limit(gateway) -> None:
    """globex may hold 2 streams: the third is refused with a retry hint, then admitted after."""
    channel, stub = chat_stub(gateway)
    with channel:
        open_calls = [
            stub.Generate(
                chat_request(f"limit-{i}", max_new_tokens=MID_STREAM_TOKENS), metadata=auth(GLOBEX_KEY), timeout=60
            )
            for i in range(2)
        ]
        for call in open_calls:
            next(call)  # first event: the stream is open at the gateway
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(chat_request("limit-2"), metadata=auth(GLOBEX_KEY), timeout=10))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "concurrent streams" in info.value.details()
        assert dict(info.value.trailing_metadata())["retry-after-ms"] == "250"
        # Another tenant is not affected.
        collect(stub.Generate(chat_request("limit-acme", 1), metadata=auth(ACME_KEY), timeout=30))
        for call in open_calls:
            call.cancel()
        deadline = time.monotonic() + 10
        while True:  # admitted once the gateway has seen the cancellations
            try:
                _, _, final = collect(stub.Generate(chat_request("limit-3", 1), metadata=auth(GLOBEX_KEY), timeout=30))
                break
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline, e
                time.sleep(0.05)
        assert final.finish_reason != chat_pb2.FINISH_REASON_UNSPECIFIED


def test_client_cancel_aborts_engine_work(gateway, engines) -> None:
    conv = "cancel-me"
    owner = engines[ring_owner(ENGINE_IDS, conv)]
    channel, stub = chat_stub(gateway)
    with channel:
        call = stub.Generate(chat_request(conv, max_new_tokens=2000), metadata=auth(ACME_KEY), timeout=60)
        next(call)
        assert engine_load(owner).running_requests + engine_load(owner).waiting_requests >= 1
        call.cancel()
    wait_idle(owner, timeout_s=5.0)


def test_deadline_propagates_to_engine(gateway, engines) -> None:
    conv = "deadline"
    owner = engines[ring_owner(ENGINE_IDS, conv)]
    channel, stub = chat_stub(gateway)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(chat_request(conv, max_new_tokens=4000), metadata=auth(ACME_KEY), timeout=0.5))
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_idle(owner, timeout_s=5.0)


# --- shared session table in Redis --------------------------------------------------------------


def route_all(gateway, conversations, max_new_tokens: int = 1) -> dict[str, str]:
    channel, stub = chat_stub(gateway)
    with channel:
        return {
            conv: collect(stub.Generate(chat_request(conv, max_new_tokens), metadata=auth(ACME_KEY), timeout=60))[
                2
            ].engine_id
            for conv in conversations
        }


def test_stickiness_survives_gateway_restart_with_redis(engines, tenants_file, workdir, redis_server) -> None:
    conversations = [f"restart-{i}" for i in range(24)]
    two = [engines["e0"], engines["e1"]]
    first = start_gateway(two, tenants_file, workdir, name="gw-restart-a", redis_url=redis_server.url)
    try:
        wait_engines_serving(first, ["e0", "e1"])
        placed = route_all(first, conversations)
    finally:
        first.stop()
    assert set(placed.values()) == {"e0", "e1"}
    # e2 joins; the ring now owns some of these dialogues by e2, but Redis remembers their engines.
    would_move = [c for c in conversations if ring_owner(ENGINE_IDS, c) != placed[c]]
    assert would_move, "test needs dialogues whose ring owner changes"
    second = start_gateway(engines.values(), tenants_file, workdir, name="gw-restart-b", redis_url=redis_server.url)
    try:
        wait_engines_serving(second, ENGINE_IDS)
        assert route_all(second, conversations) == placed
    finally:
        second.stop()
    # Without the shared table the same restart moves them (so the check above can fail).
    ring_only = start_gateway(engines.values(), tenants_file, workdir, name="gw-restart-c")
    try:
        wait_engines_serving(ring_only, ENGINE_IDS)
        moved = route_all(ring_only, would_move)
        assert all(moved[c] == ring_owner(ENGINE_IDS, c) != placed[c] for c in would_move)
    finally:
        ring_only.stop()


def test_two_replicas_route_a_dialogue_to_the_same_engine(engines, tenants_file, workdir, redis_server) -> None:
    conversations = [f"replicas-{i}" for i in range(24)]
    # The replicas see different member sets, so their rings disagree; the shared table decides.
    r1 = start_gateway([engines["e0"], engines["e1"]], tenants_file, workdir, name="gw-r1", redis_url=redis_server.url)
    r2 = start_gateway(engines.values(), tenants_file, workdir, name="gw-r2", redis_url=redis_server.url)
    try:
        wait_engines_serving(r1, ["e0", "e1"])
        wait_engines_serving(r2, ENGINE_IDS)
        placed = route_all(r1, conversations)
        assert route_all(r2, conversations) == placed
        assert route_all(r1, conversations) == placed
        assert any(ring_owner(ENGINE_IDS, c) != placed[c] for c in conversations)
    finally:
        r1.stop()
        r2.stop()


def test_redis_down_gateway_keeps_serving(engines, tenants_file, workdir) -> None:
    from gateway_helpers import RedisServer

    redis = RedisServer().start()
    gw = start_gateway(
        engines.values(),
        tenants_file,
        workdir,
        name="gw-redis-down",
        redis_url=redis.url,
        extra=["--redis-retry-interval-s", "0.2"],
    )
    restarted = None
    try:
        wait_engines_serving(gw, ENGINE_IDS)
        assert metric_value(gateway_metrics(gw), "salon_gateway_session_store_up") == 1
        placed = route_all(gw, ["down-0", "down-1"])
        redis.kill()
        # Ring fallback: served, and (no load) on the ring owners.
        during = route_all(gw, ["down-0", "down-1", "down-2"])
        assert during == {c: ring_owner(ENGINE_IDS, c) for c in during}
        assert placed == {c: during[c] for c in placed}
        text = gateway_metrics(gw)
        assert metric_value(text, "salon_gateway_session_store_up") == 0
        assert metric_value(text, "salon_gateway_session_store_errors_total") >= 1
        restarted = RedisServer(redis.port).start()
        time.sleep(0.3)
        route_all(gw, ["down-3"])
        assert metric_value(gateway_metrics(gw), "salon_gateway_session_store_up") == 1
    finally:
        gw.stop()
        redis.stop()
        if restarted is not None:
            restarted.stop()


def test_api_keys_never_logged(gateway, workdir) -> None:
    """Runs after the tests above (same module): the gateway's log never holds a presented key."""
    channel, stub = chat_stub(gateway)
    with channel:
        with pytest.raises(grpc.RpcError):
            collect(stub.Generate(chat_request("keys"), metadata=auth("wrong-secret-key-42"), timeout=10))
        collect(stub.Generate(chat_request("keys", 1), metadata=auth(ACME_KEY), timeout=30))
    log_text = (workdir / "gateway.log").read_text()
    assert "engine_health" in log_text  # the log is the right one and not empty
    for secret in (ACME_KEY, GLOBEX_KEY, "wrong-secret-key-42"):
        assert secret not in log_text


def test_same_conversation_id_in_two_tenants_is_two_dialogues(gateway) -> None:
    conv = next(
        f"shared-{i}"
        for i in range(1000)
        if ring_owner(ENGINE_IDS, f"shared-{i}", "acme") != ring_owner(ENGINE_IDS, f"shared-{i}", "globex")
    )
    channel, stub = chat_stub(gateway)
    with channel:
        for _ in range(2):
            for tenant, key in (("acme", ACME_KEY), ("globex", GLOBEX_KEY)):
                _, _, final = collect(stub.Generate(chat_request(conv, 1), metadata=auth(key), timeout=30))
                assert final.engine_id == ring_owner(ENGINE_IDS, conv, tenant)
