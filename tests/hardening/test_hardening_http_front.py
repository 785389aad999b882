"""The HTTP front against hostile bodies and slow clients: every refusal has its status and names the
field or the limit, and a hostile request does not slow another tenant's request by more than 50 ms.

The stall checks compare the 90th percentile latency of another tenant's cheap call (GET /v1/models, or
a one-token chat that also crosses the engine) while the hostile requests are in flight with its own
figure just before, in the same test; a positive control checks that the hostile requests really were
answered during the measurement.
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import threading
import time

import grpc
import httpx
import pytest
from hardening_stack import MODEL, start_engine, start_gateway, stop_all, wait_gateway_sees, write_tenants

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.common.errors import ResourceExhausted
from salon.gateway.http.errors import from_salon_error

KEY_ATTACKER = "sk-http-front-attacker-41c7"
KEY_PROBE = "sk-http-front-probe-9b20"
KEY_LIMITED = "sk-http-front-limited-6a13"
KEY_CAPPED = "sk-http-front-capped-0d58"
TENANTS = {
    "tenants": [
        {"tenant_id": "attacker", "api_key": KEY_ATTACKER, "namespace_salt": "salt-attacker"},
        {"tenant_id": "probe", "api_key": KEY_PROBE, "namespace_salt": "salt-probe"},
        {
            "tenant_id": "limited",
            "api_key": KEY_LIMITED,
            "namespace_salt": "salt-limited",
            "requests_per_s": 0.01,
            "burst_requests": 2,
        },
        {"tenant_id": "capped", "api_key": KEY_CAPPED, "namespace_salt": "salt-capped", "max_concurrent_streams": 4},
    ]
}
MAX_BODY_BYTES = 4 << 20
CONTEXT_TOKENS = 4096  # synthetic-tiny's
VOCAB = 262_144  # synthetic-tiny's (Gemma's vocabulary)
HEADER_TIMEOUT_S = 1.0
MAX_SLOWDOWN_MS = 50.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("http_front")
    engine = gateway = None
    try:
        engine = start_engine("e0", tmp)
        gateway = start_gateway(
            {"e0": engine},
            write_tenants(tmp / "tenants.json", TENANTS),
            tmp,
            extra=["--http-port", "0", "--http-header-timeout-s", str(HEADER_TIMEOUT_S)],
        )
        wait_gateway_sees(gateway, 1)
        url = f"http://127.0.0.1:{gateway.extra_ports['http_port']}"
        models = httpx.get(f"{url}/v1/models", headers=_auth(KEY_PROBE), timeout=30)
        assert models.status_code == 200 and models.json()["data"][0]["max_model_len"] == CONTEXT_TOKENS
        yield engine, gateway, url
    finally:
        stop_all([gateway, engine])


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def _post_raw(url: str, path: str, body: bytes, key: str = KEY_ATTACKER) -> tuple[int, dict]:
    """POST with http.client (its socket writes release the GIL, so the probe's timing stays honest)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", path, body=body, headers={**_auth(key), "content-type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


TINY_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}


class _Probe:
    """Another tenant's cheap call, timed: GET /v1/models (the gateway alone) or, with `through_engine`,
    a one-token chat completion (the engine's loop too)."""

    def __init__(self, url: str, through_engine: bool = False):
        self.client = httpx.Client(base_url=url, headers=_auth(KEY_PROBE), timeout=30)
        self.through_engine = through_engine

    def call(self) -> None:
        if self.through_engine:
            response = self.client.post("/v1/chat/completions", json=TINY_CHAT)
        else:
            response = self.client.get("/v1/models")
        assert response.status_code == 200, response.text

    def p90_ms(self, num_calls: int = 30, until=lambda: True) -> float:
        """The 90th percentile of at least `num_calls` calls, made until `until()` holds too (60 s at most)."""
        times = []
        deadline = time.monotonic() + 60
        while len(times) < num_calls or not until():
            assert time.monotonic() < deadline, f"{len(times)} probe calls and the condition never held"
            started = time.perf_counter()
            self.call()
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.01)
        return statistics.quantiles(times, n=10)[-1]

    def close(self) -> None:
        self.client.close()


def _slowdown_ms(url: str, attack, num_attackers: int = 2, through_engine: bool = False) -> tuple[float, float, list]:
    """(baseline p90, p90 under attack, the attack's answers) of the probe's calls."""
    probe = _Probe(url, through_engine)
    probe.call()  # warm: connection open, model info cached
    answers: list = []
    stop = threading.Event()

    def attacker() -> None:
        while not stop.is_set():
            answers.append(attack())

    try:
        baseline_ms = probe.p90_ms()
        threads = [threading.Thread(target=attacker) for _ in range(num_attackers)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while not answers:  # the attack is under way (one answered) before measuring
            assert time.monotonic() < deadline, "no answer to the hostile request"
            time.sleep(0.01)
        num_before = len(answers)
        # Positive control: the hostile requests are answered while the probe measures (three at least).
        attacked_ms = probe.p90_ms(until=lambda: len(answers) - num_before >= 3)
        num_during = len(answers) - num_before
        stop.set()
        for t in threads:
            t.join(60)
    finally:
        stop.set()
        probe.close()
    print(f"probe p90 {baseline_ms:.1f} ms alone, {attacked_ms:.1f} ms under attack ({num_during} answered)")
    return baseline_ms, attacked_ms, answers


# ---- the body cap -------------------------------------------------------------------------------


def test_a_declared_body_over_the_cap_is_413_before_it_is_sent(stack) -> None:
    _, _, url = stack
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + KEY_ATTACKER.encode() + b"\r\ncontent-length: 104857600\r\n\r\n"
        )
        answer = b""
        while chunk := sock.recv(65536):  # none of the 100 MB was sent; the server closes after answering
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["param"] == "body" and error["code"] == "request_too_large"
    assert error["message"] == f"body: Content-Length 104857600 is over the limit of {MAX_BODY_BYTES} bytes"


def test_a_streamed_body_over_the_cap_is_413(stack) -> None:
    _, _, url = stack

    def chunks():  # chunked: no Content-Length to refuse by
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        for _ in range(5):
            yield b"a" * (1 << 20)
        yield b'"}'

    response = httpx.post(f"{url}/v1/completions", content=chunks(), headers=_auth(KEY_ATTACKER), timeout=60)
    assert response.status_code == 413
    error = _error(response)
    assert error["message"] == f"body: more than the limit of {MAX_BODY_BYTES} bytes" and error["param"] == "body"


def test_a_large_body_does_not_stall_another_tenant(stack) -> None:
    """Just under the cap, two million token ids: parsed in the worker process and refused there, while
    the probe's calls are served as before (on the loop this body cost a quarter of a second of
    parsing, and its validation seconds)."""
    _, _, url = stack
    head, tail = b'{"model": "' + MODEL.encode() + b'", "prompt": [', b"]}"
    body = head + b",".join([b"1"] * ((MAX_BODY_BYTES - len(head) - len(tail)) // 2)) + tail
    assert len(body) <= MAX_BODY_BYTES
    baseline_ms, attacked_ms, answers = _slowdown_ms(url, lambda: _post_raw(url, "/v1/completions", body))
    for status, answer in answers:
        assert status == 413, answer
        assert answer["error"]["message"] == "body: more than 262144 JSON values", answer
    assert attacked_ms - baseline_ms <= MAX_SLOWDOWN_MS


# ---- bad values: 400 naming the field -----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "fields", "param", "message"),
    [
        ("/v1/completions", {"max_tokens": 10**12}, "max_tokens", "Input should be less than or equal to 4294967295"),
        (
            "/v1/completions",
            {"max_tokens": 2**32 + 5},
            "max_tokens",
            "Input should be less than or equal to 4294967295",
        ),
        (
            "/v1/completions",
            {"max_tokens": CONTEXT_TOKENS},
            "max_tokens",
            f"{CONTEXT_TOKENS} leaves no room for a prompt in the context of {CONTEXT_TOKENS} tokens",
        ),
        (
            "/v1/completions",
            {"stop_token_ids": [2**40]},
            "stop_token_ids.0",
            "Input should be less than or equal to 2147483647",
        ),
        ("/v1/completions", {"prompt": [5, 2**40]}, "prompt.1", "Input should be less than or equal to 2147483647"),
        ("/v1/completions", {"prompt": [5, -1]}, "prompt.1", "Input should be greater than or equal to 0"),
        (
            "/v1/completions",
            {"prompt": [5] * CONTEXT_TOKENS},
            "prompt",
            f"{CONTEXT_TOKENS} token ids leave no room to generate in the context of {CONTEXT_TOKENS} tokens",
        ),
        (
            "/v1/completions",
            {"prompt": [[5], [5] * CONTEXT_TOKENS]},
            "prompt[1]",
            f"{CONTEXT_TOKENS} token ids leave no room to generate in the context of {CONTEXT_TOKENS} tokens",
        ),
        ("/v1/completions", {"top_k": 2**33}, "top_k", "Input should be less than or equal to 4294967295"),
        ("/detokenize", {"tokens": [-1]}, "tokens.0", "Input should be greater than or equal to 0"),
        (
            "/v1/completions",
            {"prompt": [5, VOCAB]},
            "prompt.1",
            f"token id {VOCAB} is not below the vocabulary size {VOCAB}",
        ),
        (
            "/v1/completions",
            {"prompt": [[5], [5, 6, VOCAB + 7]]},
            "prompt.1.2",
            f"token id {VOCAB + 7} is not below the vocabulary size {VOCAB}",
        ),
        (
            "/detokenize",
            {"tokens": [3, VOCAB]},
            "tokens.1",
            f"token id {VOCAB} is not below the vocabulary size {VOCAB}",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 1, str(VOCAB): 2}},
            f"logit_bias.{VOCAB}",
            f"token id {VOCAB} is not below the vocabulary size {VOCAB}",
        ),
        (  # int() refuses a string of over 4,300 digits: this key was a 500
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"9" * 5000: 1}},
            "logit_bias." + "9" * 5000,
            f"token id {'9' * 5000} is not below the vocabulary size {VOCAB}",
        ),
        (
            "/detokenize",
            {"tokens": [5] * (CONTEXT_TOKENS + 1)},
            "tokens",
            f"{CONTEXT_TOKENS + 1} token ids are more than the context of {CONTEXT_TOKENS} tokens",
        ),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "x"}] * CONTEXT_TOKENS},
            "messages",
            f"{CONTEXT_TOKENS} messages cannot fit in the context of {CONTEXT_TOKENS} tokens",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}] * 20_000},
            "messages",
            "List should have at most 16384 items after validation, not 20000",
        ),
    ],
)
def test_out_of_range_values_are_400_naming_the_field(stack, path, fields, param, message) -> None:
    _, _, url = stack
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4} if path == "/v1/completions" else {"model": MODEL}
    if path == "/v1/chat/completions":
        body["max_tokens"] = 4
    body.update(fields)
    response = httpx.post(url + path, json=body, headers=_auth(KEY_ATTACKER), timeout=30)
    assert response.status_code == 400, response.text
    error = _error(response)
    assert (error["param"], error["message"]) == (param, f"{param}: {message}")
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("depth", [40, 100_000])
def test_deeply_nested_json_is_400(stack, depth) -> None:
    """100,000 levels raised RecursionError (500); 40 levels pass the JSON parser and are caught by the
    shape check."""
    _, _, url = stack
    body = b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "metadata": ' + b"[" * depth + b"]" * depth + b"}"
    response = httpx.post(f"{url}/v1/completions", content=body, headers=_auth(KEY_ATTACKER), timeout=30)
    assert response.status_code == 400, response.text
    error = _error(response)
    assert error["param"] == "body" and error["message"] == "body: JSON is nested deeper than 32 levels"


@pytest.mark.parametrize(
    "path,fields,param",
    [
        ("/v1/chat/completions", '"messages": [{"role": "user", "content": "hi \\ud800"}]', "messages.0.content"),
        (
            "/v1/chat/completions",
            '"messages": [{"role": "user", "content": "\\udfff"}], "x": "' + "y" * 20_000 + '"',
            "messages.0.content",
        ),  # a body past the inline size: parsed in the worker process
        ("/v1/completions", '"prompt": "\\ud83d"', "prompt"),
        ("/v1/completions", '"prompt": "x", "metadata": {"\\ud800": "k"}', "metadata"),
    ],
)
def test_a_lone_surrogate_is_400_naming_the_field(stack, path, fields, param) -> None:
    """JSON's escapes allow a lone surrogate ("\\ud800"); UTF-8, which the tokenizer and protobuf take, does not:
    a chat message holding one was a 500. (A pair, an emoji's "\\ud83d\\ude00", is one character.)"""
    _, _, url = stack
    body = f'{{"model": "{MODEL}", "max_tokens": 2, {fields}}}'.encode()
    response = httpx.post(url + path, content=body, headers=_auth(KEY_ATTACKER), timeout=30)
    assert response.status_code == 400, response.text
    error = _error(response)
    assert (
        error["param"] == param and error["message"] == f"{param}: is not valid Unicode text (a lone surrogate escape)"
    )
    pair = f'{{"model": "{MODEL}", "max_tokens": 2, "prompt": "\\ud83d\\ude00"}}'.encode()
    assert httpx.post(f"{url}/v1/completions", content=pair, headers=_auth(KEY_ATTACKER), timeout=30).status_code == 200


def test_a_message_over_grpcs_size_limit_is_413_not_429() -> None:
    error = from_salon_error(ResourceExhausted("CLIENT: Sent message larger than max (70000000 vs. 67108864)"))
    assert (error.status, error.code, error.retry_after_ms) == (413, "request_too_large", None)
    rate = from_salon_error(ResourceExhausted("tenant x: request rate above 5/s", retry_after_ms=200))
    assert (rate.status, rate.code, rate.retry_after_ms) == (429, "rate_limit_exceeded", 200)


# ---- tokenize / detokenize: bounded, off the loop, admitted ---------------------------------------


def test_a_huge_tokenize_is_refused_without_stalling_another_tenant(stack) -> None:
    """130,000 messages, just under the body cap (a million once got 504 after 17 s with the engine's
    loop busy for 10 s): refused from the body's shape in the worker process, the engine never asked."""
    _, _, url = stack
    messages = b",".join([b'{"role":"user","content":"x"}'] * 130_000)
    body = b'{"model": "' + MODEL.encode() + b'", "messages": [' + messages + b"]}"
    assert len(body) <= MAX_BODY_BYTES
    attack = lambda: _post_raw(url, "/tokenize", body)  # noqa: E731
    baseline_ms, attacked_ms, answers = _slowdown_ms(url, attack, through_engine=True)
    for status, answer in answers:
        assert (status, answer["error"]["message"]) == (413, "body: more than 262144 JSON values"), answer
    assert attacked_ms - baseline_ms <= MAX_SLOWDOWN_MS


def test_the_engine_refuses_tokenize_and_detokenize_from_their_counts(stack) -> None:
    engine, _, _ = stack
    with grpc.insecure_channel(engine.address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        stub = engine_pb2_grpc.EngineServiceStub(channel)
        dialogue = chat_pb2.Dialogue(messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, text="x")] * 1_000_000)
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(engine_pb2.TokenizeRequest(dialogue=dialogue), timeout=30)
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert info.value.details() == (
            f"dialogue.messages: 1000000 messages cannot fit in the context of {CONTEXT_TOKENS} tokens"
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.Detokenize(engine_pb2.DetokenizeRequest(token_ids=[5] * 2_000_000), timeout=30)
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert info.value.details() == f"token_ids: 2000000 ids cannot fit in the context of {CONTEXT_TOKENS} tokens"
        # Within the counts, both answer.
        ids = stub.Tokenize(engine_pb2.TokenizeRequest(text="hello salon"), timeout=30).token_ids
        assert stub.Detokenize(engine_pb2.DetokenizeRequest(token_ids=ids), timeout=30).text.endswith("hello salon")


def test_tokenize_and_detokenize_spend_the_tenants_rate(stack) -> None:
    """The limited key has a burst of 2 and then one request per 100 s: a third call is 429, whichever
    endpoint (40 rapid /detokenize calls once all got 200 where chat got 429)."""
    _, _, url = stack
    headers = _auth(KEY_LIMITED)
    first = httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": "hi"}, headers=headers, timeout=30)
    assert first.status_code == 200, first.text
    second = httpx.post(f"{url}/detokenize", json={"model": MODEL, "tokens": [5, 6]}, headers=headers, timeout=30)
    assert second.status_code == 200, second.text
    for path, body in (("/detokenize", {"tokens": [5, 6]}), ("/tokenize", {"prompt": "hi"})):
        response = httpx.post(url + path, json={"model": MODEL, **body}, headers=headers, timeout=30)
        assert response.status_code == 429, response.text
        error = _error(response)
        assert (
            error["code"] == "rate_limit_exceeded" and error["message"] == "tenant limited: request rate above 0.01/s"
        )
        assert int(response.headers["retry-after"]) >= 1


# ---- n against the stream cap -------------------------------------------------------------------


def test_n_choices_count_against_the_stream_cap(stack) -> None:
    """The capped key may hold 4 streams: n=8 can never be admitted (400); with 2 streams open, n=3 is
    429 naming the cap and n=2 is served; once those end, n=4 is served."""
    _, _, url = stack
    client = httpx.Client(base_url=url, headers=_auth(KEY_CAPPED), timeout=60)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "count"}], "temperature": 1}
    try:
        response = client.post("/v1/chat/completions", json={**chat, "n": 8, "max_tokens": 2})
        assert response.status_code == 400, response.text
        error = _error(response)
        assert error["param"] == "n"
        assert error["message"] == "n: 8 choices are more than this key's limit of 4 concurrent streams"
        # Two streams held open: the client reads one chunk and stops (20 alternatives per token and a
        # small receive buffer keep the reply from being written out). A reply that still ends before
        # the next request is admitted is tried again: with n counted as one stream, every try is 200.
        held = {**chat, "n": 2, "max_tokens": 4000, "seed": 7, "stream": True, "logprobs": True, "top_logprobs": 20}
        small_window = httpx.HTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
        holder = httpx.Client(base_url=url, headers=_auth(KEY_CAPPED), timeout=60, transport=small_window)
        statuses = []
        with holder:
            for _ in range(10):
                with holder.stream("POST", "/v1/chat/completions", json=held) as stream:
                    assert stream.status_code == 200
                    next(stream.iter_lines())
                    refused = client.post("/v1/chat/completions", json={**chat, "n": 3, "max_tokens": 2})
                    statuses.append(refused.status_code)
                    if refused.status_code != 429:
                        continue
                    assert _error(refused)["message"] == (
                        "tenant capped: 3 streams asked for, 2 of the limit of 4 concurrent streams free"
                    )
                    served = client.post("/v1/chat/completions", json={**chat, "n": 2, "max_tokens": 2})
                    assert served.status_code == 200 and len(served.json()["choices"]) == 2, served.text
                    break
        assert statuses[-1] == 429, statuses
        deadline = time.monotonic() + 30
        while True:  # the held streams are released once their client is gone
            response = client.post("/v1/chat/completions", json={**chat, "n": 4, "max_tokens": 2})
            if response.status_code == 200:
                break
            assert response.status_code == 429 and time.monotonic() < deadline, response.text
            time.sleep(0.05)
        assert len(response.json()["choices"]) == 4
    finally:
        client.close()


# ---- slow clients -------------------------------------------------------------------------------


def test_slow_headers_are_cut_off_and_others_are_served(stack) -> None:
    """50 connections that dribble their request head never finish it: each is closed once the head is
    HEADER_TIMEOUT_S late, while a normal request is served meanwhile."""
    _, _, url = stack
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(50):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        sock.setblocking(False)
        socks.append(sock)
    try:
        started = time.monotonic()
        assert httpx.get(f"{url}/v1/models", headers=_auth(KEY_PROBE), timeout=10).status_code == 200
        open_socks = list(socks)
        while open_socks:
            assert time.monotonic() - started < HEADER_TIMEOUT_S + 10, f"{len(open_socks)} slow clients still held"
            still = []
            for sock in open_socks:
                try:
                    sock.sendall(b"x")  # one more byte of a header that never ends
                    if sock.recv(1024) == b"":
                        continue  # closed by the server
                except BlockingIOError:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    continue
                still.append(sock)
            open_socks = still
            time.sleep(0.1)
        assert time.monotonic() - started >= HEADER_TIMEOUT_S * 0.9
    finally:
        for sock in socks:
            sock.close()
