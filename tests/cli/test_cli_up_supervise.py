"""`salon up --engines 2` keeps the stack up: a SIGKILLed engine's stream completes on the other engine
and the dead one comes back; a SIGKILLed kvstore costs recomputes, then hits resume after its restart;
the stack never stops. When salon up itself is SIGKILLed, no child outlives it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import grpc
from test_cli_up_chat import SALON, free_ports

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.api.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from salon.gateway.ring import HashRing
from salon.gateway.types import TenantId, dialogue_key

ENGINES = ["engine-0", "engine-1"]
KEY = "cli-supervise-key"


def _pid(state: Path, name: str) -> int:
    return int((state / f"{name}.pid").read_text())


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return False
    return "zombie" not in state.lower()


def _serving_engines(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(r"^salon_gateway_engine_serving\{[^}]*\} (\S+)$", text, re.M))


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _turn(stub, conversation: str, history: list[str], max_new_tokens: int = 6) -> chat_pb2.GenerateFinal:
    messages = [
        chat_pb2.Message(role=chat_pb2.ROLE_USER if i % 2 == 0 else chat_pb2.ROLE_CHARACTER, text=t)
        for i, t in enumerate(history)
    ]
    request = chat_pb2.GenerateRequest(
        conversation_id=conversation,
        dialogue=chat_pb2.Dialogue(messages=messages),
        character=chat_pb2.Character(name="Ada", definition="A lighthouse keeper."),
        sampling=chat_pb2.SamplingParams(max_new_tokens=max_new_tokens),
    )
    final = None
    for event in stub.Generate(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=120):
        if event.HasField("final"):
            final = event.final
    assert final is not None
    return final


def _pool_engines(stub) -> set[str]:
    response = stub.ListModels(chat_pb2.ListModelsRequest(), metadata=(("authorization", f"Bearer {KEY}"),), timeout=10)
    return {e.engine_id for m in response.models for e in m.engines if e.serving}


def _logged(log: Path, event: str, **fields) -> bool:
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == event and all(record.get(k) == v for k, v in fields.items()):
                return True
    return False


def _kvstore_stats(state: Path, port: int) -> kvstore_pb2.GetStatsResponse | None:
    tls = state / "tls"
    credentials = grpc.ssl_channel_credentials(
        (tls / "ca.pem").read_bytes(), (tls / "engine.key").read_bytes(), (tls / "engine.pem").read_bytes()
    )
    try:
        with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            return kvstore_pb2_grpc.KVStoreServiceStub(channel).GetStats(kvstore_pb2.GetStatsRequest(), timeout=2)
    except grpc.RpcError:
        return None


def _kvstore_blocks(state: Path, port: int) -> int:
    stats = _kvstore_stats(state, port)
    return -1 if stats is None else stats.num_blocks


def test_salon_up_restarts_what_dies_and_never_stops(tmp_path):
    gw, kv, eng, metrics, http = free_ports(5, engines=2)
    state = tmp_path / "state"
    up = subprocess.Popen(
        [
            *SALON,
            "up",
            "--model",
            "synthetic-tiny",
            "--engines",
            "2",
            "--gateway-port",
            str(gw),
            "--kvstore-port",
            str(kv),
            "--engine-base-port",
            str(eng),
            "--metrics-base-port",
            str(metrics),
            "--http-port",
            str(http),
            "--state-dir",
            str(state),
            "--api-key",
            KEY,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    notices: list[str] = []
    threading.Thread(target=lambda: notices.extend(up.stderr), daemon=True).start()
    children: list[int] = []
    try:
        line = ""
        deadline = time.monotonic() + 400
        while "Ctrl-C stops everything" not in line:
            line = up.stdout.readline()
            assert line or up.poll() is None, "".join(notices)
            assert time.monotonic() < deadline
        threading.Thread(target=lambda: [None for _ in up.stdout], daemon=True).start()
        children = [_pid(state, n) for n in ("kvstore", *ENGINES, "gateway")]
        _wait(lambda: _serving_engines(metrics) == 2, 60, "the gateway never saw both engines")
        ring = HashRing(ENGINES)
        conversation, fresh = [
            f"dialogue-{i}"
            for i in range(100)
            if ring.owner(dialogue_key(TenantId("local"), f"dialogue-{i}")) == "engine-0"
        ][:2]
        channel = grpc.insecure_channel(f"127.0.0.1:{gw}")
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        # The model's pool holds an engine once the gateway knows which model it serves: wait for both, so
        # that the dialogue goes to its ring owner engine-0.
        _wait(lambda: _pool_engines(stub) == {"engine-0", "engine-1"}, 60, "the model's pool never held both engines")

        # 1. An engine SIGKILLed mid-stream: the stream completes on the other engine.
        request = chat_pb2.GenerateRequest(
            conversation_id=conversation,
            tokens=chat_pb2.TokenizedPrompt(token_ids=[2] + [1124] * 30),
            sampling=chat_pb2.SamplingParams(max_new_tokens=300),
        )
        call = stub.Generate(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=180)
        received = list(next(call).delta.token_ids)
        victim = _pid(state, "engine-0")
        os.kill(victim, signal.SIGKILL)
        final = None
        for event in call:
            if event.HasField("final"):
                final = event.final
            else:
                received.extend(event.delta.token_ids)
        assert final is not None and final.failovers == 1 and final.engine_id == "engine-1"
        assert final.usage.generated_tokens == len(received)
        # 2. The dead engine comes back (a new process on its port) and serves again.
        _wait(
            lambda: (state / "engine-0.pid").exists() and _pid(state, "engine-0") != victim,
            30,
            "engine-0 was not started again",
        )
        _wait(lambda: _serving_engines(metrics) == 2, 180, "engine-0 did not come back")
        _wait(lambda: _pool_engines(stub) == {"engine-0", "engine-1"}, 60, "engine-0 did not rejoin its model's pool")
        assert any("engine-0 was killed by SIGKILL; restarting it" in n for n in notices), notices
        # The failed-over dialogue stays where its KV now is; a new one owned by engine-0 goes there.
        conversation = fresh
        assert _turn(stub, conversation, ["Good evening."]).engine_id == "engine-0"

        # 3. The kvstore SIGKILLed: turns still succeed; after its restart, hits come from it again.
        history = [f"message {i} about the tides and the harbour lights" for i in range(12)]
        old_kv = _pid(state, "kvstore")
        os.kill(old_kv, signal.SIGKILL)
        assert _turn(stub, conversation, history).engine_id == "engine-0"
        _wait(
            lambda: _pid(state, "kvstore") != old_kv and _kvstore_blocks(state, kv) >= 0,
            60,
            "the kvstore was not started again",
        )
        history += ["a reply", "and another question about the boats"]
        _wait(
            lambda: _turn(stub, conversation, history) and _kvstore_blocks(state, kv) > 0,
            60,
            "no KV reached the restarted kvstore",
        )
        # Engines notice the new arena by themselves and map it off their event loops.
        arena = _kvstore_stats(state, kv).shm_name
        _wait(
            lambda: _logged(state / "engine-1.log", "kvstore_arena_mapped", arena=arena),
            60,
            "engine-1 did not map the restarted kvstore's arena",
        )
        owner = _pid(state, "engine-0")
        os.kill(owner, signal.SIGKILL)  # its device cache dies with it: only the kvstore holds the dialogue
        history += ["one more", "what about the storm?"]
        final = _turn(stub, conversation, history)
        assert final.engine_id == "engine-1" and final.usage.cached_tokens.host > 0, final
        assert up.poll() is None, "salon up stopped"
        channel.close()
    finally:
        children += [_pid(state, n) for n in ("kvstore", *ENGINES, "gateway") if (state / f"{n}.pid").exists()]
        # 4. salon up SIGKILLed (as when its terminal or tmux session goes): its children stop too.
        up.kill()
        up.wait(10)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        leftover = [p for p in children if _alive(p)]
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
    assert not leftover, f"children outlived salon up: {leftover}"
