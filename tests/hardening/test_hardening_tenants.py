"""Tenant isolation through the gateway: tenant B never gets cached tokens from tenant A's entries,
neither from the engine's own cache (device) nor from the kvstore (host); API keys appear in no log
or trace file of any service.

Two gateways (same tenant table) front two engines that share one kvstore, so a test can pick the
engine: gw0 -> e0, gw1 -> e1.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest
from hardening_stack import (
    KEY_A,
    KEY_B,
    auth,
    chat_stub,
    collect,
    start_engine,
    start_gateway,
    stop_all,
    wait_gateway_sees,
    write_tenants,
)

from salon.api.chat.v1 import chat_pb2
from salon.api.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service

WRONG_KEY = "sk-hardening-not-a-tenant-9d81"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tenants")
    procs = {}
    try:
        procs["kv"] = start_service(
            "kvstore",
            [
                *INSECURE_LOOPBACK_FLAGS,
                "--port",
                "0",
                "--capacity-bytes",
                str(64 << 20),
                "--log-json",
                "true",
                "--trace-file",
                str(tmp / "kv.spans.jsonl"),
            ],
            log_path=tmp / "kvstore.log",
        )
        tenants = write_tenants(tmp / "tenants.json")
        for i in range(2):
            procs[f"e{i}"] = start_engine(
                f"e{i}",
                tmp,
                extra=["--kvstore-target", procs["kv"].address, "--trace-file", str(tmp / f"e{i}.spans.jsonl")],
            )
        for i in range(2):
            procs[f"gw{i}"] = start_gateway(
                {f"e{i}": procs[f"e{i}"]},
                tenants,
                tmp,
                name=f"gw{i}",
                extra=["--trace-file", str(tmp / f"gw{i}.spans.jsonl")],
            )
            wait_gateway_sees(procs[f"gw{i}"], 1)
        yield procs, tmp
    finally:
        stop_all(reversed(list(procs.values())))


def _request() -> chat_pb2.GenerateRequest:
    history = [
        chat_pb2.Message(
            role=chat_pb2.ROLE_USER if i % 2 == 0 else chat_pb2.ROLE_CHARACTER,
            text=f"line {i}: the lighthouse keeper counts the ships at dusk",
        )
        for i in range(8)
    ]
    return chat_pb2.GenerateRequest(
        conversation_id="same-dialogue-id",
        character=chat_pb2.Character(name="Ada", definition="Ada keeps the lighthouse and speaks briefly."),
        dialogue=chat_pb2.Dialogue(messages=history),
        sampling=chat_pb2.SamplingParams(max_new_tokens=4),
    )


def _usage(gateway, key: str) -> chat_pb2.Usage:
    channel, stub = chat_stub(gateway.address)
    with channel:
        return collect(stub.Generate(_request(), metadata=auth(key), timeout=60)).final.usage


def _wait_stored(kv_address: str, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(kv_address) as channel:
        stub = kvstore_pb2_grpc.KVStoreServiceStub(channel)
        while True:
            num_blocks = stub.GetStats(kvstore_pb2.GetStatsRequest(), timeout=5).num_blocks
            if num_blocks > 0:
                return num_blocks
            assert time.monotonic() < deadline, "the kvstore received no blocks"
            time.sleep(0.05)


GENERATE = "/salon.chat.v1.ChatService/Generate"
MODEL_INFO = "/salon.chat.v1.ChatService/GetModelInfo"


def _wait_until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the control"
        time.sleep(0.05)


def _finished(log: Path, method: str, code: str) -> list[dict]:
    """The access lines (rpc_finished) of `method` with status `code` in a JSON log."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return [
        r
        for r in records
        if r.get("event") == "rpc_finished" and r.get("rpc_method") == method and r.get("code") == code
    ]


def test_tenant_b_gets_nothing_from_tenant_a(stack) -> None:
    procs, _ = stack
    first_a = _usage(procs["gw0"], KEY_A)
    assert first_a.prompt_tokens > 48
    assert (first_a.cached_tokens.device, first_a.cached_tokens.host) == (0, 0)
    _wait_stored(procs["kv"].address)
    # e0's device cache and the kvstore both hold A's prompt now; B's identical prompt gets none of it.
    b_on_e0 = _usage(procs["gw0"], KEY_B)
    assert b_on_e0.prompt_tokens == first_a.prompt_tokens
    assert (b_on_e0.cached_tokens.device, b_on_e0.cached_tokens.host) == (0, 0)
    # Controls (so the checks above can fail): A itself hits both caches.
    a_on_e1 = _usage(procs["gw1"], KEY_A)
    assert a_on_e1.cached_tokens.device == 0 and a_on_e1.cached_tokens.host > 0
    a_on_e0 = _usage(procs["gw0"], KEY_A)
    assert a_on_e0.cached_tokens.device > 0


def test_api_keys_in_no_log_or_trace(stack) -> None:
    """Runs after the traffic above; adds refused calls with a wrong key and a malformed header."""
    procs, tmp = stack
    channel, stub = chat_stub(procs["gw0"].address)
    with channel:
        for metadata in (auth(WRONG_KEY), (("authorization", f"Basic {KEY_B}"),)):
            with pytest.raises(grpc.RpcError) as info:
                collect(stub.Generate(_request(), metadata=metadata, timeout=10))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert KEY_B not in info.value.details() and WRONG_KEY not in info.value.details()
        stub.GetModelInfo(chat_pb2.GetModelInfoRequest(), metadata=auth(KEY_A), timeout=10)
    # Positive control before the absence checks: the refused calls and the last call have reached gw0's log and
    # trace file, so the files below hold everything these calls could have leaked.
    log, spans_file = tmp / "gw0.log", tmp / "gw0.spans.jsonl"
    _wait_until(lambda: len(_finished(log, GENERATE, "UNAUTHENTICATED")) >= 2 and _finished(log, MODEL_INFO, "OK"))
    _wait_until(lambda: MODEL_INFO in spans_file.read_text(errors="replace") if spans_file.exists() else False)
    files = sorted(tmp.glob("*.log")) + sorted(tmp.glob("*.spans.jsonl"))
    assert len(files) == 10, [f.name for f in files]
    for path in files:
        text = path.read_text(errors="replace")
        assert text.strip(), f"{path.name} is empty"
        for secret in (KEY_A, KEY_B, WRONG_KEY):
            assert secret not in text, f"{path.name} holds an API key"
            assert secret[len("sk-") :] not in text, f"{path.name} holds part of an API key"
    spans = "".join(p.read_text() for p in tmp.glob("gw*.spans.jsonl"))
    assert "salon.chat.v1.ChatService/Generate" in spans
