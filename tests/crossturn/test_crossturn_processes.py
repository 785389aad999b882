"""Cross-turn cache across real processes: engine -> kvstore -> another engine; kvstore faults.

Two engine processes (synthetic-tiny) share one kvstore process. Turn 1 runs on engine A; turn 2 of
the same dialogue runs on engine B, whose own cache is empty, so its prefix comes from the kvstore.
Every reply is compared with an engine that has no cache at all.
"""

from __future__ import annotations

import signal
import time

import grpc
import pytest

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.api.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service

CHARACTER = chat_pb2.Character(name="Ada", definition="Ada is a patient teacher of sailing. " * 6)


def history(n, topic="knots, tides and the wind over the bay"):
    msgs = []
    for i in range(n):
        role = chat_pb2.ROLE_USER if i % 2 == 0 else chat_pb2.ROLE_CHARACTER
        msgs.append(
            chat_pb2.Message(
                role=role, author="u" if role == chat_pb2.ROLE_USER else "", text=f"message {i} about {topic}."
            )
        )
    return msgs


def generate(address, messages, salt="tenant-1", conversation_id="c1", max_new=8, timeout=120):
    request = engine_pb2.GenerateRequest(
        conversation_id=conversation_id,
        namespace_salt=salt,
        character=CHARACTER,
        dialogue=chat_pb2.Dialogue(messages=messages),
        sampling=chat_pb2.SamplingParams(max_new_tokens=max_new),
    )
    with grpc.insecure_channel(address) as ch:
        events = list(engine_pb2_grpc.EngineServiceStub(ch).Generate(request, timeout=timeout))
    ids = [t for e in events if e.HasField("delta") for t in e.delta.token_ids]
    return ids, events[-1].final


def stored_blocks(address):
    with grpc.insecure_channel(address) as ch:
        return kvstore_pb2_grpc.KVStoreServiceStub(ch).GetStats(kvstore_pb2.GetStatsRequest()).num_blocks


def wait_for_put(address, min_blocks=1, timeout_s=20):
    """Puts are asynchronous: wait until the kvstore holds at least min_blocks blocks."""
    deadline = time.monotonic() + timeout_s
    while (held := stored_blocks(address)) < min_blocks:
        if time.monotonic() > deadline:
            raise AssertionError(f"the kvstore holds {held} blocks, not {min_blocks}, after {timeout_s} s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crossturn")
    procs = {}
    try:
        procs["kv"] = start_service(
            "kvstore",
            [*INSECURE_LOOPBACK_FLAGS, "--port", "0", "--capacity-bytes", str(256 << 20)],
            log_path=tmp / "kv.log",
        )
        engine_args = [
            "--port",
            "0",
            "--model",
            "synthetic-tiny",
            "--kvstore-target",
            procs["kv"].address,
            "--kvstore-timeout-s",
            "0.5",
        ]
        engine_args += INSECURE_LOOPBACK_FLAGS
        procs["a"] = start_service("engine", [*engine_args, "--engine-id", "a"], log_path=tmp / "a.log")
        procs["b"] = start_service("engine", [*engine_args, "--engine-id", "b"], log_path=tmp / "b.log")
        procs["plain"] = start_service(
            "engine",
            [
                *INSECURE_LOOPBACK_FLAGS,
                "--port",
                "0",
                "--model",
                "synthetic-tiny",
                "--engine-id",
                "plain",
                "--no-prefix-cache",
                "true",
            ],
            log_path=tmp / "plain.log",
        )
        yield procs, tmp
    finally:
        for p in procs.values():
            p.stop()


def test_turn_two_on_another_engine_fetches_from_the_kvstore(cluster):
    procs, _ = cluster
    messages = history(12)
    reply, final1 = generate(procs["a"].address, messages)
    assert final1.usage.cached_tokens.host == 0 and final1.usage.cached_tokens.device == 0
    wait_for_put(procs["kv"].address)
    body = [t for t in reply if t != 106]
    turn2 = messages + [
        chat_pb2.Message(role=chat_pb2.ROLE_CHARACTER, token_ids=body),
        chat_pb2.Message(role=chat_pb2.ROLE_USER, author="u", text="And what about reefing?"),
    ]
    out, final2 = generate(procs["b"].address, turn2)
    expected, plain = generate(procs["plain"].address, turn2)
    assert plain.usage.cached_tokens.host == plain.usage.cached_tokens.device == 0
    assert out == expected
    assert final2.usage.cached_tokens.device == 0
    # Turn 1's prompt + reply, minus the never-computed last token, in whole blocks.
    assert final2.usage.cached_tokens.host == (final1.usage.prompt_tokens + len(reply) - 1) // 16 * 16
    # Turn 3 back on engine A: its own device cache holds turn 1, the kvstore holds turn 2: the longer wins.
    turn3 = turn2 + [
        chat_pb2.Message(role=chat_pb2.ROLE_CHARACTER, token_ids=[t for t in out if t != 106]),
        chat_pb2.Message(role=chat_pb2.ROLE_USER, author="u", text="Thanks!"),
    ]
    # Engine B's put of turn 2 has landed when the kvstore holds its blocks as well as turn 1's.
    wait_for_put(procs["kv"].address, min_blocks=(final2.usage.prompt_tokens + len(out) - 1) // 16)
    out3, final3 = generate(procs["a"].address, turn3)
    expected3 = generate(procs["plain"].address, turn3)[0]
    if out3 != expected3:  # which source gave the prefix, and what engine B makes of the same prefix
        usage = final3.usage.cached_tokens
        on_b = generate(procs["b"].address, turn3)[0]
        raise AssertionError(
            f"turn 3 on engine A: {out3}, recomputed: {expected3}; A's prefix: {usage.host} tokens from the kvstore, "
            f"{usage.device} from its device cache; engine B (kvstore prefix): {on_b}"
        )
    assert final3.usage.cached_tokens.host > final1.usage.prompt_tokens


def test_another_tenant_gets_nothing_from_the_kvstore(cluster):
    procs, _ = cluster
    messages = history(10)
    held = stored_blocks(procs["kv"].address)
    reply, first = generate(procs["a"].address, messages, salt="tenant-x", conversation_id="cx")
    wait_for_put(procs["kv"].address, min_blocks=held + (first.usage.prompt_tokens + len(reply) - 1) // 16)
    _, same = generate(procs["b"].address, messages, salt="tenant-x", conversation_id="cx")
    _, other = generate(procs["b"].address, messages, salt="tenant-y", conversation_id="cy")
    assert same.usage.cached_tokens.host > 0
    assert other.usage.cached_tokens.host == 0 and other.usage.cached_tokens.device == 0


def test_dead_then_restarted_kvstore_means_recompute_then_hits_again(cluster):
    procs, tmp = cluster
    kv = procs["kv"]
    port = kv.port
    kv.kill()
    messages = history(8)
    started = time.monotonic()
    out, final = generate(procs["b"].address, messages, conversation_id="dead-1")
    assert final.usage.cached_tokens.host == 0
    assert out == generate(procs["plain"].address, messages)[0]
    assert time.monotonic() - started < 30
    procs["kv"] = start_service(
        "kvstore",
        [*INSECURE_LOOPBACK_FLAGS, "--port", str(port), "--capacity-bytes", str(256 << 20)],
        log_path=tmp / "kv2.log",
    )
    # The engines reconnect by themselves: a put from one engine, then a hit on the other (a new
    # dialogue each try, so engine b's own cache never has it).
    deadline = time.monotonic() + 30
    for attempt in range(100):
        fresh = history(8, topic=f"harbour number {attempt}")
        generate(procs["a"].address, fresh, conversation_id="dead-2")
        time.sleep(0.5)
        _, again = generate(procs["b"].address, fresh, conversation_id="dead-3")
        if again.usage.cached_tokens.host > 0 or time.monotonic() > deadline:
            break
    assert again.usage.cached_tokens.host > 0 and again.usage.cached_tokens.device == 0


def test_stalled_kvstore_costs_a_timeout_not_a_hang(cluster):
    procs, _ = cluster
    kv = procs["kv"]
    kv.signal(signal.SIGSTOP)
    try:
        messages = history(6, topic="a stalled store")
        started = time.monotonic()
        out, final = generate(procs["b"].address, messages, conversation_id="stall", timeout=60)
        elapsed = time.monotonic() - started
        assert final.usage.cached_tokens.host == 0
        assert out == generate(procs["plain"].address, messages)[0]
        assert elapsed < 20
    finally:
        kv.signal(signal.SIGCONT)
