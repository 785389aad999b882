"""The gateway makes the engine's request ids: two tenants that pick the same request id (in the field or
in `x-request-id`) at the same time are both served, and each gets its own id back in the final."""

from __future__ import annotations

import json
import threading

import pytest
from hardening_stack import (
    KEY_A,
    KEY_B,
    assert_engine_clean,
    auth,
    chat_request,
    chat_stub,
    collect,
    start_engine,
    start_gateway,
    stop_all,
    wait_gateway_sees,
    write_tenants,
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("request-ids")
    engine = gateway = None
    try:
        engine = start_engine("e0", tmp)
        gateway = start_gateway({"e0": engine}, write_tenants(tmp / "tenants.json"), tmp)
        wait_gateway_sees(gateway, 1)
        yield engine, gateway, tmp
    finally:
        stop_all([gateway, engine])


@pytest.mark.parametrize("where", ["field", "x-request-id"])
def test_the_same_client_request_id_from_two_tenants_never_collides(stack, where) -> None:
    engine, gateway, tmp = stack
    results: dict[str, object] = {}
    started = threading.Barrier(2)

    def run(key: str) -> None:
        request = chat_request(f"ids-{where}-{key[-4:]}", max_new_tokens=40)
        metadata = auth(key)
        if where == "field":
            request.request_id = "same-id"
        else:
            metadata = (*metadata, ("x-request-id", "same-id"))
        channel, stub = chat_stub(gateway.address)
        with channel:
            try:
                call = stub.Generate(request, metadata=metadata, timeout=60)
                first = next(call)
                started.wait(30)  # both streams are open on the engine at once
                results[key] = collect([first, *call])
            except Exception as exc:  # noqa: BLE001 - reported below
                results[key] = exc

    threads = [threading.Thread(target=run, args=(key,)) for key in (KEY_A, KEY_B)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    for key, reply in results.items():
        assert not isinstance(reply, Exception), (key, reply)
        assert reply.final is not None and reply.final.request_id == "same-id"
    # The engine saw two ids of the gateway's making, neither of them the clients' own.
    engine_ids = {
        json.loads(line).get("request_id")
        for line in (tmp / "engine-e0.log").read_text().splitlines()
        if line.startswith("{") and '"rpc_finished"' in line and "Generate" in line
    }
    assert "same-id" not in engine_ids and len(engine_ids) >= 2
    assert_engine_clean(engine)
