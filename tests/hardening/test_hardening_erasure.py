"""DeleteConversation through a real gateway, two engines and a kvstore that checks namespace grants:
the deleted dialogue's next request hits nothing (no device, no host cache, no sticky session), another
dialogue of the same tenant still hits, a reply streaming for the deleted dialogue is ended, and the
kvstore keeps blocks that another live conversation also put."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from hardening_stack import (
    KEY_A,
    assert_engine_clean,
    assert_gateway_clean,
    auth,
    start_engine,
    start_gateway,
    stop_all,
    wait_gateway_sees,
    write_tenants,
)

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.api.kvstore.v1 import kvstore_pb2
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.kvstore_contract.client import KVStoreClient
from salon.common.kvstore_contract.layout import KVLayout
from salon.common.process import start_service

GRANT_KEY = "3c" * 32


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("erasure")
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
                "--grace-s",
                "1",
                "--namespace-grant-key-file",
                str(grant_key),
                *INSECURE_LOOPBACK_FLAGS,
            ],
            log_path=tmp / "kvstore.log",
        )
        for engine_id in ("e0", "e1"):
            procs[engine_id] = start_engine(engine_id, tmp, extra=["--kvstore-target", procs["kv"].address])
        procs["gw"] = start_gateway(
            {e: procs[e] for e in ("e0", "e1")},
            write_tenants(tmp / "tenants.json"),
            tmp,
            extra=["--namespace-grant-key-file", str(grant_key)],
        )
        wait_gateway_sees(procs["gw"], 2)
        yield procs
    finally:
        stop_all(reversed(list(procs.values())))


def _request(conversation: str, character: str, history: list[str], max_new_tokens: int = 6):
    messages = [
        chat_pb2.Message(role=chat_pb2.ROLE_USER if i % 2 == 0 else chat_pb2.ROLE_CHARACTER, text=t)
        for i, t in enumerate(history)
    ]
    return chat_pb2.GenerateRequest(
        conversation_id=conversation,
        dialogue=chat_pb2.Dialogue(messages=messages),
        character=chat_pb2.Character(
            name=character, definition=f"{character} keeps a lighthouse and answers in few words."
        ),
        sampling=chat_pb2.SamplingParams(max_new_tokens=max_new_tokens),
    )


def _turn(stub, conversation, character, history) -> chat_pb2.GenerateFinal:
    final = None
    text = []
    for event in stub.Generate(_request(conversation, character, history), metadata=auth(KEY_A), timeout=60):
        if event.HasField("final"):
            final = event.final
        else:
            text.append(event.delta.text)
    history.append("".join(text) or "…")
    return final


def _routes(gateway, outcome: str) -> float:
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(v)
        for v in re.findall(rf'^salon_gateway_route_decisions_total\{{outcome="{outcome}"\}} (\S+)$', text, re.M)
    )


def _cached(final) -> int:
    return final.usage.cached_tokens.device + final.usage.cached_tokens.host


def test_a_deleted_dialogue_hits_nothing_and_another_still_hits(stack) -> None:
    procs = stack
    a = [f"line {i} of the first dialogue, about the tides" for i in range(10)]
    b = [f"line {i} of the second dialogue, about the storm" for i in range(10)]
    with grpc.insecure_channel(procs["gw"].address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        _turn(stub, "erase-a", "Ada", a)
        _turn(stub, "keep-b", "Bea", b)
        a.append("and the next question")
        b.append("and the next question")
        assert _cached(_turn(stub, "erase-a", "Ada", a)) > 0  # both hit before the erasure
        assert _cached(_turn(stub, "keep-b", "Bea", b)) > 0
        time.sleep(0.5)  # the puts after the replies land in the kvstore
        deleted = stub.DeleteConversation(
            chat_pb2.DeleteConversationRequest(conversation_id="erase-a"), metadata=auth(KEY_A), timeout=30
        )
        assert deleted.engines == 2 and deleted.device_blocks_dropped > 0 and deleted.host_blocks_dropped > 0
        a.append("one more question")
        b.append("one more question")
        sticky = _routes(procs["gw"], "sticky")
        after = _turn(stub, "erase-a", "Ada", a)
        assert _routes(procs["gw"], "sticky") == sticky  # the session entry went too: placed afresh
        assert after.usage.prompt_tokens > 200
        assert (after.usage.cached_tokens.device, after.usage.cached_tokens.host) == (0, 0)
        assert _cached(_turn(stub, "keep-b", "Bea", b)) > 0
        assert _routes(procs["gw"], "sticky") == sticky + 1
        # Deleting again is harmless; an unknown dialogue too.
        again = stub.DeleteConversation(
            chat_pb2.DeleteConversationRequest(conversation_id="never-seen"), metadata=auth(KEY_A), timeout=30
        )
        assert again.engines == 2 and again.device_blocks_dropped == 0 and again.host_blocks_dropped == 0
        with pytest.raises(grpc.RpcError) as info:
            stub.DeleteConversation(
                chat_pb2.DeleteConversationRequest(conversation_id=""), metadata=auth(KEY_A), timeout=10
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as info:
            stub.DeleteConversation(chat_pb2.DeleteConversationRequest(conversation_id="keep-b"), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_reply_streaming_for_a_deleted_dialogue_is_ended(stack) -> None:
    procs = stack
    with grpc.insecure_channel(procs["gw"].address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        call = stub.Generate(
            _request("erase-live", "Cy", ["tell me a long story"], max_new_tokens=3000),
            metadata=auth(KEY_A),
            timeout=120,
        )
        assert next(call).HasField("delta")
        finals = []
        reader = threading.Thread(target=lambda: finals.extend(e.final for e in call if e.HasField("final")))
        reader.start()
        stub.DeleteConversation(
            chat_pb2.DeleteConversationRequest(conversation_id="erase-live"), metadata=auth(KEY_A), timeout=30
        )
        reader.join(30)
    assert finals and finals[0].finish_reason == chat_pb2.FINISH_REASON_ABORTED
    for engine_id in ("e0", "e1"):
        assert_engine_clean(procs[engine_id])
    assert_gateway_clean(procs["gw"])


async def test_the_kvstore_keeps_blocks_another_live_conversation_put(stack) -> None:
    """Two conversations put the same first blocks (a shared character definition): dropping one
    removes only the blocks nobody else put."""
    import numpy as np

    from salon.common import namespace_grant
    from salon.common.kvstore_contract.client import NamespaceClaim
    from salon.common.prefix_hash import namespace_digest

    layout = KVLayout(4, 64, 0, 0)
    salt = "erasure-test"
    ns = namespace_digest("m", "t", salt)
    claim = NamespaceClaim(salt, "m", "t", namespace_grant.issue(bytes.fromhex(GRANT_KEY), salt, time.time()))
    shared, first, second = list(range(8)), list(range(8, 16)), list(range(16, 24))
    client = KVStoreClient(stack["kv"].address)
    try:
        rows = np.arange(4 * 64, dtype=np.uint8).reshape(4, 64)
        assert (
            await client.put(ns, shared + first, layout, rows, conversation_id="c1", claim=claim)
        ).stored_blocks == 4
        assert (
            await client.put(ns, shared + second, layout, rows, conversation_id="c2", claim=claim)
        ).stored_blocks == 2
        assert await client.drop(ns, "c1", claim=claim) == 2
        assert (await client.match(ns, shared + first, layout)).matched_tokens == 8  # shared with c2: kept
        assert (await client.match(ns, shared + second, layout)).matched_tokens == 16
        assert await client.drop(ns, "c2", claim=claim) == 4
        assert (await client.match(ns, shared, layout)).matched_tokens == 0
        assert await client.drop(ns, "c2") is None  # without the claim: refused (PERMISSION_DENIED)
        stats = await client.stats()
        assert isinstance(stats, kvstore_pb2.GetStatsResponse)
    finally:
        await client.close()
