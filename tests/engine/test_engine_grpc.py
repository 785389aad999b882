"""The engine as a real process over gRPC (synthetic-tiny): streaming, cancel, abort, deadline, queue
limit, validation, seeded sampling and failover resume, the activation recipe its ready log names. After every
scenario, no KV block is held."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service
from tests.model.conftest import gemma_served_activations

USER, CHARACTER = chat_pb2.ROLE_USER, chat_pb2.ROLE_CHARACTER


def start_engine(tmp_path_factory, name: str, *flags: str):
    log = tmp_path_factory.mktemp(name) / "engine.log"
    return start_service(
        "engine",
        [
            *INSECURE_LOOPBACK_FLAGS,
            "--port",
            "0",
            "--model",
            "synthetic-tiny",
            "--engine-id",
            name,
            "--kv-cache-bytes",
            str(8 << 20),
            *flags,
        ],
        log_path=log,
        timeout_s=300,
    )


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    proc = start_engine(tmp_path_factory, "e-test")
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def stub(engine):
    with grpc.insecure_channel(engine.address) as channel:
        yield engine_pb2_grpc.EngineServiceStub(channel)


def dialogue_request(text="Hello there", max_new_tokens=8, **sampling):
    return engine_pb2.GenerateRequest(
        request_id=sampling.pop("request_id", ""),
        conversation_id="c1",
        character=chat_pb2.Character(name="Ada", definition="A helpful test character."),
        dialogue=chat_pb2.Dialogue(messages=[chat_pb2.Message(role=USER, text=text)]),
        sampling=chat_pb2.SamplingParams(max_new_tokens=max_new_tokens, **sampling),
    )


def collect(responses):
    tokens, text, final = [], "", None
    for r in responses:
        if r.HasField("delta"):
            tokens.extend(r.delta.token_ids)
            text += r.delta.text
        else:
            final = r.final
    return tokens, text, final


def wait_all_blocks_free(stub, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        load = stub.GetLoad(engine_pb2.GetLoadRequest()).load
        # Blocks kept by the prefix cache are reclaimable, not leaked.
        available = load.free_kv_blocks + load.cached_kv_blocks
        if available == load.total_kv_blocks and load.running_requests == 0 and load.waiting_requests == 0:
            return load
        assert time.monotonic() < deadline, f"blocks still held: {load}"
        time.sleep(0.05)


def test_generate_streams_tokens_then_final(stub):
    tokens, text, final = collect(stub.Generate(dialogue_request(max_new_tokens=12), timeout=60))
    assert final.finish_reason in (chat_pb2.FINISH_REASON_LENGTH, chat_pb2.FINISH_REASON_STOP_TOKEN)
    assert final.usage.generated_tokens == len(tokens) <= 12
    assert final.usage.prompt_tokens > 10
    assert final.engine_id == "e-test" and final.request_id
    assert 0 <= final.timings.queue_ms <= final.timings.ttft_ms <= final.timings.total_ms
    info = stub.GetModelInfo(engine_pb2.GetModelInfoRequest()).model
    assert info.model_id == "synthetic-tiny" and info.vocab_size == 262144 and info.kv_block_size_tokens == 16
    assert list(info.eos_token_ids) == [1, 106, 212]
    wait_all_blocks_free(stub)


def test_pretokenized_prompt_and_greedy_determinism(stub):
    req = engine_pb2.GenerateRequest(
        tokens=chat_pb2.TokenizedPrompt(token_ids=[2, 9259, 1902] * 20),
        sampling=chat_pb2.SamplingParams(max_new_tokens=10),
    )
    a = collect(stub.Generate(req, timeout=60))[0]
    b = collect(stub.Generate(req, timeout=60))[0]
    assert a == b and len(a) > 0


def test_seeded_sampling_reproducible_and_resume_continues(stub):
    req = dialogue_request(max_new_tokens=16, temperature=1.5, top_k=50, top_p=0.95, seed=7)
    req.sampling.stop_token_ids.extend([])
    a, _, fa = collect(stub.Generate(req, timeout=60))
    b, _, _ = collect(stub.Generate(req, timeout=60))
    assert a == b
    if len(a) >= 6:
        resumed = engine_pb2.GenerateRequest()
        resumed.CopyFrom(req)
        resumed.resume_token_ids.extend(a[:5])
        c, _, fc = collect(stub.Generate(resumed, timeout=60))
        assert c == a[5:]
        assert fc.usage.generated_tokens == fa.usage.generated_tokens
    wait_all_blocks_free(stub)


def test_client_cancel_frees_blocks(stub):
    call = stub.Generate(dialogue_request(max_new_tokens=3000), timeout=60)
    got = 0
    for r in call:
        got += len(r.delta.token_ids)
        if got >= 3:
            break
    call.cancel()
    wait_all_blocks_free(stub)


def test_abort_ends_stream_with_aborted(stub):
    call = stub.Generate(dialogue_request(max_new_tokens=3000, request_id="abort-me"), timeout=60)
    first = next(call)
    assert first.HasField("delta")
    assert stub.Abort(engine_pb2.AbortRequest(request_id="abort-me")).aborted
    *_, final = collect(call)
    assert final.finish_reason == chat_pb2.FINISH_REASON_ABORTED
    assert not stub.Abort(engine_pb2.AbortRequest(request_id="abort-me")).aborted
    wait_all_blocks_free(stub)


def test_deadline_is_honoured(stub):
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        collect(stub.Generate(dialogue_request(max_new_tokens=3000), timeout=0.7))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - start < 5
    wait_all_blocks_free(stub)


@pytest.mark.parametrize(
    "mutate, code, field",
    [
        (lambda r: r.sampling.__setattr__("temperature", float("nan")), "INVALID_ARGUMENT", "sampling.temperature"),
        (lambda r: r.sampling.__setattr__("temperature", -1.0), "INVALID_ARGUMENT", "sampling.temperature"),
        (lambda r: r.sampling.__setattr__("top_p", 1.5), "INVALID_ARGUMENT", "sampling.top_p"),
        (lambda r: r.sampling.__setattr__("max_new_tokens", 10**9), "INVALID_ARGUMENT", "sampling.max_new_tokens"),
        (lambda r: r.sampling.__setattr__("max_new_tokens", 4090), "OUT_OF_RANGE", "sampling.max_new_tokens"),
        (lambda r: r.dialogue.messages[0].__setattr__("role", 0), "INVALID_ARGUMENT", "dialogue.messages[0].role"),
        (lambda r: r.dialogue.messages[0].__setattr__("role", 9), "INVALID_ARGUMENT", "dialogue.messages[0].role"),
        (lambda r: r.dialogue.messages[0].token_ids.append(5), "INVALID_ARGUMENT", "dialogue.messages[0]"),
        (lambda r: r.dialogue.ClearField("messages"), "INVALID_ARGUMENT", "dialogue.messages"),
        (lambda r: r.ClearField("dialogue"), "INVALID_ARGUMENT", "context"),
        (lambda r: r.tokens.token_ids.extend([2, 262144]), "INVALID_ARGUMENT", "tokens.token_ids[1]"),
        (lambda r: r.resume_token_ids.append(10**6), "INVALID_ARGUMENT", "resume_token_ids[0]"),
        (lambda r: r.sampling.stop_strings.append(""), "INVALID_ARGUMENT", "sampling.stop_strings[0]"),
        (lambda r: r.dialogue.messages[0].__setattr__("text", "word " * 5000), "OUT_OF_RANGE", "prompt"),
    ],
)
def test_bad_input_names_the_field(stub, mutate, code, field):
    req = dialogue_request()
    mutate(req)
    with pytest.raises(grpc.RpcError) as err:
        collect(stub.Generate(req, timeout=30))
    assert err.value.code() == getattr(grpc.StatusCode, code), err.value.details()
    assert field in err.value.details()
    wait_all_blocks_free(stub)


def test_watch_load_streams_reports(stub):
    call = stub.WatchLoad(engine_pb2.WatchLoadRequest(interval_ms=50), timeout=10)
    reports = [next(call).load for _ in range(3)]
    call.cancel()
    assert all(r.engine_id == "e-test" and r.total_kv_blocks > 0 for r in reports)


def test_queue_full_is_resource_exhausted(tmp_path_factory):
    proc = start_engine(tmp_path_factory, "e-queue", "--max-num-running", "1", "--max-waiting-requests", "1")
    try:
        with grpc.insecure_channel(proc.address) as channel:
            stub = engine_pb2_grpc.EngineServiceStub(channel)
            running = stub.Generate(dialogue_request(max_new_tokens=3000, request_id="r1"), timeout=60)
            next(running)  # r1 is in the batch
            waiting = stub.Generate(dialogue_request(max_new_tokens=3000, request_id="r2"), timeout=60)
            waiter = threading.Thread(target=lambda: collect(waiting), daemon=True)
            waiter.start()
            deadline = time.monotonic() + 10
            while stub.GetLoad(engine_pb2.GetLoadRequest()).load.waiting_requests < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            with pytest.raises(grpc.RpcError) as err:
                collect(stub.Generate(dialogue_request(max_new_tokens=5), timeout=30))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "queue is full" in err.value.details()
            assert dict(err.value.trailing_metadata()).get("retry-after-ms") == "1000"
            running.cancel()
            assert stub.Abort(engine_pb2.AbortRequest(request_id="r2")).aborted
            waiter.join(10)
            wait_all_blocks_free(stub)
    finally:
        proc.stop()


def ready_line(proc) -> dict:
    """The engine's engine_ready log record (logged before it reports SERVING), polled while the log is flushed."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in proc.log_path.read_text().splitlines() if '"engine_ready"' in line]
        if lines or time.monotonic() > deadline:
            assert len(lines) == 1, lines
            return json.loads(lines[0])
        time.sleep(0.05)


def test_the_ready_log_names_the_activation_recipe_served(engine, tmp_path_factory):
    """synthetic-tiny is a Gemma 3 model: served with group32 activations unless a recipe is named
    (salon.engine.model.activation_recipe), and the engine_ready line says which."""
    assert ready_line(engine)["activations"] == gemma_served_activations() and ready_line(engine)["precision"] == "int8"
    proc = start_engine(tmp_path_factory, "e-two-terms", "--activations", "two_terms")
    try:
        assert ready_line(proc)["activations"] == "two_terms"
    finally:
        assert proc.stop() == 0
