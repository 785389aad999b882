"""Hostile schemas against a real SmolLM2-135M stack (one engine with a 0.5 s compile limit, a gateway serving
the HTTP API), through the official `openai` package: deep nesting, a huge enum and many optional properties
are refused with a 400 naming the limit before anything compiles, a schema within those limits that compiles
too slowly is refused naming the time limit (its worker killed), and another client's plain request keeps its
latency: its p90 over 30 calls while the hostile schemas stream in stays within 50 ms of its p90 alone (the
issue's bound on the cost a hostile schema may put on others)."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest

from tests.hardening.hardening_stack import start_engine, start_gateway, stop_all, wait_gateway_sees
from tests.openai.openai_stack import KEY, TENANTS

MODEL = "smollm2-135m-instruct"
CALLS = 30
# Between the schemas refused before compiling: a flood of requests costs the gateway's and the engine's loops
# whatever the requests hold (the tenants' rate limits bound that); what is measured is the cost of the schemas.
PAUSE_S = 0.05
MESSAGES = [{"role": "user", "content": "Name a colour."}]


def deep(levels: int, key: str = "a") -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {key: schema}, "required": [key]}
    return schema


# (schema, strict, the 400's message): each refused before it compiles (the gateway bounds a body's nesting;
# the engine its schema's, for gRPC clients too).
REFUSED = [
    (deep(40), True, "body: JSON is nested deeper than 32 levels"),
    ({"enum": [f"v{i}" for i in range(5000)]}, True, "enum at /enum has 5000 values, more than 1024"),
    (
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(40)}},
        False,
        "more than 16 optional properties in objects that admit other keys",
    ),
]


def slow(i: int) -> dict:
    """Within every shape limit, but 12 nested objects that admit any other key and 16 optional properties: about
    2 s to compile."""
    optional = {f"p{j}": {"type": "integer"} for j in range(16)}
    return {"type": "object", "properties": {f"k{i}": deep(11), **optional}, "required": [f"k{i}"]}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    engine = gateway = None
    try:
        engine = start_engine("e0", tmp, extra=["--model", MODEL, "--grammar-compile-timeout-s", "0.5"])
        tenants = tmp / "tenants.json"
        tenants.write_text(json.dumps(TENANTS))
        gateway = start_gateway({"e0": engine}, tenants, tmp, extra=["--http-port", "0"])
        wait_gateway_sees(gateway, 1)
        url = f"http://127.0.0.1:{gateway.extra_ports['http_port']}/v1"
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=120)
        wait_for_compile_workers(client)
        yield client
    finally:
        stop_all([gateway, engine])


def wait_for_compile_workers(client: openai.OpenAI) -> None:
    """A constrained request waits for the engine's compile workers within the compile limit (0.5 s here): a
    429 while they start."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with_schema(client, {"type": "integer"}, strict=True)
            return
        except openai.RateLimitError as exc:
            assert "did not start within 0.5 s" in exc.body["message"], exc.body
            assert time.monotonic() < deadline, "the compile workers did not start"
            time.sleep(0.2)


def with_schema(client: openai.OpenAI, schema: dict, strict: bool):
    return client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=4,
        response_format={"type": "json_schema", "json_schema": {"name": "h", "schema": schema, "strict": strict}},
    )


def p90_latency(client: openai.OpenAI) -> float:
    seconds = []
    for _ in range(CALLS):
        start = time.perf_counter()
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
        seconds.append(time.perf_counter() - start)
        assert reply.choices[0].message.content
    return sorted(seconds)[int(0.9 * CALLS) - 1]


def test_each_hostile_schema_is_refused_naming_its_limit(client):
    for schema, strict, message in REFUSED:
        with pytest.raises(openai.BadRequestError) as refused:
            with_schema(client, schema, strict)
        assert refused.value.status_code == 400
        assert message in refused.value.body["message"], refused.value.body
    with pytest.raises(openai.BadRequestError) as refused:
        with_schema(client, slow(0), strict=False)
    assert "json_schema: did not compile within 0.5 s (too complex)" in refused.value.body["message"]
    # The positive control: the same shape with closed objects compiles within the limit.
    reply = with_schema(client, slow(0), strict=True)
    assert reply.choices[0].message.content.startswith('{"k0')


def test_hostile_schemas_keep_another_clients_latency(client):
    p90_latency(client)  # warm: the first calls pay one-off costs
    alone = p90_latency(client)
    stop = threading.Event()
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def send_hostile(schemas, pause_s: float) -> None:
        i = 0
        try:
            while not stop.wait(pause_s):
                schema, strict, message = schemas(i)
                with pytest.raises(openai.BadRequestError) as refused:
                    with_schema(client, schema, strict)
                assert message in refused.value.body["message"], refused.value.body
                outcomes.append(message)
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    senders = [
        threading.Thread(target=send_hostile, args=(lambda i: REFUSED[i % len(REFUSED)], PAUSE_S)),
        threading.Thread(target=send_hostile, args=(lambda i: (slow(i + 1), False, "did not compile within 0.5 s"), 0)),
    ]
    for sender in senders:
        sender.start()
    try:
        during = p90_latency(client)
    finally:
        stop.set()
        for sender in senders:
            sender.join()
    assert not errors, errors
    assert any("did not compile" in m for m in outcomes) and len(outcomes) > CALLS  # the load was there
    assert during <= alone + 0.050, (alone, during)
