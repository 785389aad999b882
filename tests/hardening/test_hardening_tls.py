"""TLS on the public port and mutual TLS between services, with certificates made by the test session
(tests/conftest.py `tls_files`): client -TLS-> gateway -mTLS-> engine -mTLS-> kvstore."""

from __future__ import annotations

import time

import grpc
import pytest

from salon.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from services.common.process import start_service
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


def _mtls_server_args(tls) -> list[str]:
    return ["--tls-cert-file", str(tls.server_cert), "--tls-key-file", str(tls.server_key),
            "--tls-client-ca-file", str(tls.ca_cert)]


def _client_credentials(tls, with_cert: bool = True) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca_cert.read_bytes(),
        private_key=tls.client_key.read_bytes() if with_cert else None,
        certificate_chain=tls.client_cert.read_bytes() if with_cert else None,
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tls_files):
    tmp = tmp_path_factory.mktemp("tls")
    mtls = _client_credentials(tls_files)
    procs = {}
    try:
        procs["kv"] = start_service("kvstore", ["--port", "0", "--capacity-bytes", str(64 << 20),
                                                *_mtls_server_args(tls_files)],
                                    log_path=tmp / "kvstore.log", wait_serving=False)
        wait_tls_serving(procs["kv"], mtls)
        procs["e0"] = start_engine("e0", tmp, wait=False, extra=[
            *_mtls_server_args(tls_files), "--kvstore-target", procs["kv"].address,
            "--kvstore-tls-ca-file", str(tls_files.ca_cert), "--kvstore-tls-cert-file", str(tls_files.client_cert),
            "--kvstore-tls-key-file", str(tls_files.client_key)])
        wait_tls_serving(procs["e0"], mtls)
        procs["gw"] = start_gateway({"e0": procs["e0"]}, write_tenants(tmp / "tenants.json"), tmp, wait=False, extra=[
            "--tls-cert-file", str(tls_files.server_cert), "--tls-key-file", str(tls_files.server_key),
            "--engine-tls-ca-file", str(tls_files.ca_cert), "--engine-tls-cert-file", str(tls_files.client_cert),
            "--engine-tls-key-file", str(tls_files.client_key)])
        wait_tls_serving(procs["gw"], grpc.ssl_channel_credentials(tls_files.ca_cert.read_bytes()))
        wait_gateway_sees(procs["gw"], 1)
        yield procs, tls_files
    finally:
        stop_all(reversed(list(procs.values())))


def test_tls_client_streams_a_reply_and_kv_reaches_the_kvstore_over_mtls(stack) -> None:
    procs, tls = stack
    credentials = grpc.ssl_channel_credentials(tls.ca_cert.read_bytes())  # public port: server auth only
    channel, stub = chat_stub(procs["gw"].address, credentials)
    with channel:
        reply = collect(stub.Generate(chat_request("tls-1", max_new_tokens=6, prompt=[2] + [1124] * 40),
                                      metadata=auth(KEY_A), timeout=60))
    assert reply.final is not None and reply.final.engine_id == "e0"
    assert reply.final.usage.generated_tokens == len(reply.token_ids) >= 1
    # The engine's put after the reply went over mutual TLS to the kvstore.
    deadline = time.monotonic() + 20
    with grpc.secure_channel(procs["kv"].address, _client_credentials(tls)) as kv_channel:
        kv = kvstore_pb2_grpc.KVStoreServiceStub(kv_channel)
        while kv.GetStats(kvstore_pb2.GetStatsRequest(), timeout=5).num_blocks == 0:
            assert time.monotonic() < deadline, "no KV reached the kvstore over mTLS"
            time.sleep(0.05)
    assert_engine_clean(procs["e0"], credentials=_client_credentials(tls))


def test_plaintext_client_fails_on_the_tls_port(stack) -> None:
    procs, _ = stack
    channel, stub = chat_stub(procs["gw"].address)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(chat_request("plain", 2), metadata=auth(KEY_A), timeout=5))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_client_trusting_another_ca_fails(stack) -> None:
    procs, tls = stack
    channel, stub = chat_stub(procs["gw"].address, grpc.ssl_channel_credentials(tls.other_ca_cert.read_bytes()))
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            collect(stub.Generate(chat_request("other-ca", 2), metadata=auth(KEY_A), timeout=5))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("service", ["e0", "kv"])
def test_services_requiring_client_certs_refuse_clients_without_one(stack, service) -> None:
    procs, tls = stack
    address = procs[service].address
    probe = (lambda ch: engine_pb2_grpc.EngineServiceStub(ch).GetLoad(engine_pb2.GetLoadRequest(), timeout=5)) \
        if service == "e0" else \
        (lambda ch: kvstore_pb2_grpc.KVStoreServiceStub(ch).GetStats(kvstore_pb2.GetStatsRequest(), timeout=5))
    for channel in (grpc.secure_channel(address, _client_credentials(tls, with_cert=False)),
                    grpc.insecure_channel(address)):
        with channel:
            with pytest.raises(grpc.RpcError) as info:
                probe(channel)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(address, _client_credentials(tls)) as channel:
        probe(channel)  # the same call with the client certificate succeeds
