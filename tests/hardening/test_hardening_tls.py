"""TLS on the public port and mutual TLS with identities between services, with certificates made by the
test session (tests/conftest.py `tls_files`): client -TLS-> gateway -mTLS-> engine -mTLS-> kvstore.

Only a gateway identity may call an engine (it alone decides namespace salts and resume tokens), only
an engine identity may call the kvstore, and the kvstore stores only into namespaces a gateway granted."""

from __future__ import annotations

import time

import grpc
import pytest
from hardening_stack import (
    KEY_A,
    assert_engine_clean,
    auth,
    chat_request,
    chat_stub,
    collect,
    start_engine,
    start_gateway,
    stop_all,
    wait_gateway_sees,
    wait_tls_serving,
    write_tenants,
)

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.api.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from salon.common import namespace_grant
from salon.common.prefix_hash import encode_token_ids, namespace_digest
from salon.common.process import start_service

GRANT_KEY = "6b" * 32


def _mtls_server_args(tls, role: str) -> list[str]:
    return [
        "--tls-cert-file",
        str(tls.cert(role)),
        "--tls-key-file",
        str(tls.key(role)),
        "--tls-client-ca-file",
        str(tls.ca_cert),
        "--health-port",
        "0",
    ]


def _as(tls, role: str | None) -> grpc.ChannelCredentials:
    """Client credentials holding `role`'s certificate (None: the certificate without a salon identity)."""
    cert, key = (tls.client_cert, tls.client_key) if role is None else (tls.cert(role), tls.key(role))
    return grpc.ssl_channel_credentials(tls.ca_cert.read_bytes(), key.read_bytes(), cert.read_bytes())


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tls_files):
    tmp = tmp_path_factory.mktemp("tls")
    grant_key = tmp / "grant.key"
    grant_key.write_text(GRANT_KEY)
    procs = {}
    try:
        procs["kv"] = start_service(
            "kvstore",
            [
                "--port",
                "0",
                "--capacity-bytes",
                str(64 << 20),
                "--namespace-grant-key-file",
                str(grant_key),
                *_mtls_server_args(tls_files, "kvstore"),
            ],
            log_path=tmp / "kvstore.log",
        )
        procs["e0"] = start_engine(
            "e0",
            tmp,
            extra=[
                *_mtls_server_args(tls_files, "engine"),
                "--kvstore-target",
                procs["kv"].address,
                "--kvstore-tls-ca-file",
                str(tls_files.ca_cert),
                "--kvstore-tls-cert-file",
                str(tls_files.cert("engine")),
                "--kvstore-tls-key-file",
                str(tls_files.key("engine")),
            ],
        )
        procs["gw"] = start_gateway(
            {"e0": procs["e0"]},
            write_tenants(tmp / "tenants.json"),
            tmp,
            extra=[
                "--tls-cert-file",
                str(tls_files.server_cert),
                "--tls-key-file",
                str(tls_files.server_key),
                "--engine-tls-ca-file",
                str(tls_files.ca_cert),
                "--engine-tls-cert-file",
                str(tls_files.cert("gateway")),
                "--engine-tls-key-file",
                str(tls_files.key("gateway")),
                "--namespace-grant-key-file",
                str(grant_key),
            ],
            wait=False,
        )
        wait_tls_serving(procs["gw"], grpc.ssl_channel_credentials(tls_files.ca_cert.read_bytes()))
        wait_gateway_sees(procs["gw"], 1)
        yield procs, tls_files, tmp
    finally:
        stop_all(reversed(list(procs.values())))


def _kv_stats(address, credentials):
    with grpc.secure_channel(address, credentials) as channel:
        return kvstore_pb2_grpc.KVStoreServiceStub(channel).GetStats(kvstore_pb2.GetStatsRequest(), timeout=5)


def test_tls_client_streams_a_reply_and_kv_reaches_the_kvstore_over_mtls(stack) -> None:
    procs, tls, tmp = stack
    credentials = grpc.ssl_channel_credentials(tls.ca_cert.read_bytes())  # public port: server auth only
    channel, stub = chat_stub(procs["gw"].address, credentials)
    with channel:
        reply = collect(
            stub.Generate(
                chat_request("tls-1", max_new_tokens=6, prompt=[2] + [1124] * 40), metadata=auth(KEY_A), timeout=60
            )
        )
    assert reply.final is not None and reply.final.engine_id == "e0"
    assert reply.final.usage.generated_tokens == len(reply.token_ids) >= 1
    # The engine's put after the reply went over mutual TLS to the kvstore, into the namespace the
    # gateway granted (the kvstore checks grants), through the shared-memory arena it mapped.
    deadline = time.monotonic() + 20
    while _kv_stats(procs["kv"].address, _as(tls, "engine")).num_blocks == 0:
        assert time.monotonic() < deadline, "no KV reached the kvstore over mTLS"
        time.sleep(0.05)
    assert "kvstore_arena_mapped" in (tmp / "engine-e0.log").read_text()
    assert_engine_clean(procs["e0"], credentials=_as(tls, "gateway"))


def test_plaintext_client_fails_on_the_tls_port(stack) -> None:
    procs, _, _ = stack
    channel, stub = chat_stub(procs["gw"].address)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(chat_request("plain", 2), metadata=auth(KEY_A), timeout=5))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_client_trusting_another_ca_fails(stack) -> None:
    procs, tls, _ = stack
    channel, stub = chat_stub(procs["gw"].address, grpc.ssl_channel_credentials(tls.other_ca_cert.read_bytes()))
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(chat_request("other-ca", 2), metadata=auth(KEY_A), timeout=5))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def _forged_generate(channel) -> None:
    """What an attacker inside the network would send: another tenant's salt, straight to the engine."""
    request = engine_pb2.GenerateRequest(
        request_id="forged",
        conversation_id="x",
        namespace_salt="salt-b",
        tokens=chat_pb2.TokenizedPrompt(token_ids=[2, 1124, 1124]),
        sampling=chat_pb2.SamplingParams(max_new_tokens=2),
    )
    list(engine_pb2_grpc.EngineServiceStub(channel).Generate(request, timeout=10))


@pytest.mark.parametrize(
    "service, allowed, call",
    [
        ("e0", "gateway", _forged_generate),
        (
            "e0",
            "gateway",
            lambda ch: engine_pb2_grpc.EngineServiceStub(ch).GetLoad(engine_pb2.GetLoadRequest(), timeout=5),
        ),
        (
            "kv",
            "engine",
            lambda ch: kvstore_pb2_grpc.KVStoreServiceStub(ch).GetStats(kvstore_pb2.GetStatsRequest(), timeout=5),
        ),
    ],
)
def test_internal_services_take_only_their_callers_identity(stack, service, allowed, call) -> None:
    procs, tls, _ = stack
    address = procs[service].address
    for role in (None, *(r for r in ("gateway", "engine", "kvstore") if r != allowed)):
        with grpc.secure_channel(address, _as(tls, role)) as channel:
            with pytest.raises(grpc.RpcError) as info:
                call(channel)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, (role, info.value)
        assert f"only {allowed} identities may call" in info.value.details()
    # Without a certificate (or without TLS) the connection itself is refused.
    for channel in (
        grpc.secure_channel(address, grpc.ssl_channel_credentials(tls.ca_cert.read_bytes())),
        grpc.insecure_channel(address),
    ):
        with channel:
            with pytest.raises(grpc.RpcError) as info:
                call(channel)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(address, _as(tls, allowed)) as channel:
        call(channel)  # the same call with the allowed identity succeeds


def test_the_kvstore_stores_only_what_a_gateway_granted(stack) -> None:
    procs, tls, _ = stack
    ns = namespace_digest("synthetic-tiny", "some-layout", "salt-b")
    layout = kvstore_pb2.KVLayout(block_size_tokens=4, global_bytes_per_block=64)

    def put(claim):
        header = kvstore_pb2.PutHeader(
            namespace=ns, token_ids_le32=encode_token_ids([1, 2, 3, 4]), layout=layout, claim=claim
        )
        requests = iter(
            [
                kvstore_pb2.PutRequest(header=header),
                kvstore_pb2.PutRequest(chunk=kvstore_pb2.KVChunk(global_kv=b"\x01" * 64)),
            ]
        )
        with grpc.secure_channel(procs["kv"].address, _as(tls, "engine")) as channel:
            return kvstore_pb2_grpc.KVStoreServiceStub(channel).Put(requests, timeout=5)

    key = bytes.fromhex(GRANT_KEY)
    now = time.time()
    good = namespace_grant.issue(key, "salt-b", now)
    cases = {
        "required": None,
        "grant: not signed for this tenant salt": kvstore_pb2.NamespaceClaim(
            tenant_salt="salt-b",
            model_id="synthetic-tiny",
            layout_tag="some-layout",
            grant=namespace_grant.issue(key, "salt-a", now),
        ),
        "grant: expired": kvstore_pb2.NamespaceClaim(
            tenant_salt="salt-b",
            model_id="synthetic-tiny",
            layout_tag="some-layout",
            grant=namespace_grant.issue(key, "salt-b", now - 2 * namespace_grant.GRANT_TTL_S),
        ),
        "grant: not signed": kvstore_pb2.NamespaceClaim(
            tenant_salt="salt-b",
            model_id="synthetic-tiny",
            layout_tag="some-layout",
            grant=namespace_grant.issue(b"not the gateways' key", "salt-b", now),
        ),
        "do not make this namespace": kvstore_pb2.NamespaceClaim(
            tenant_salt="salt-b", model_id="synthetic-tiny", layout_tag="another-layout", grant=good
        ),
    }
    for why, claim in cases.items():
        with pytest.raises(grpc.RpcError) as info:
            put(claim)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and why in info.value.details(), info.value
    ok = kvstore_pb2.NamespaceClaim(
        tenant_salt="salt-b", model_id="synthetic-tiny", layout_tag="some-layout", grant=good
    )
    assert put(ok).counts.stored_blocks == 1
    with grpc.secure_channel(procs["kv"].address, _as(tls, "engine")) as channel:
        stub = kvstore_pb2_grpc.KVStoreServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Drop(kvstore_pb2.DropRequest(namespace=ns), timeout=5)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert stub.Drop(kvstore_pb2.DropRequest(namespace=ns, claim=ok), timeout=5).dropped_blocks == 1
