"""A Node.js client (clients/node/chat.mjs: @grpc/grpc-js + @grpc/proto-loader, protos loaded at runtime)
streams a reply from a real gateway + engine; its FINAL JSON matches a Python client's greedy reply to
the same request. Generic reflection (no compiled stubs) lists and describes the public service."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from hardening_stack import (
    KEY_A,
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
from tests.requirements import missing

REPO = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")
TEXT = "Tell me about the harbour at night."
MAX_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("polyglot")
    engine = gateway = None
    try:
        engine = start_engine("e0", tmp)
        gateway = start_gateway({"e0": engine}, write_tenants(tmp / "tenants.json"), tmp)
        wait_gateway_sees(gateway, 1)
        yield gateway
    finally:
        stop_all([gateway, engine])


def _require_node() -> str:
    grpc_js = REPO / "tools" / "node_modules" / "@grpc" / "grpc-js"
    if NODE is None or not grpc_js.is_dir():
        missing("node" if NODE is None else "tools/node_modules", "scripts/setup.sh installs it")
    return NODE


def _python_reply(gateway, conversation_id: str):
    """The request chat.mjs builds, sent from Python."""
    request = chat_pb2.GenerateRequest(
        conversation_id=conversation_id,
        character=chat_pb2.Character(name="Ada", definition="Ada is a friendly engineer who answers briefly."),
        dialogue=chat_pb2.Dialogue(messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, author="node", text=TEXT)]),
        sampling=chat_pb2.SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=0),
    )
    channel, stub = chat_stub(gateway.address)
    with channel:
        return collect(stub.Generate(request, metadata=auth(KEY_A), timeout=60))


def test_node_client_streams_the_same_greedy_reply_as_python(stack) -> None:
    node = _require_node()
    gateway = stack
    result = subprocess.run(
        [
            node,
            str(REPO / "clients" / "node" / "chat.mjs"),
            "--target",
            gateway.address,
            "--api-key",
            KEY_A,
            "--conversation-id",
            "node-dialogue",
            "--max-new-tokens",
            str(MAX_NEW_TOKENS),
            TEXT,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    streamed, final_line = result.stdout.rsplit("\nFINAL ", 1)
    final = json.loads(final_line)
    expected = _python_reply(gateway, "python-dialogue")
    assert final["token_ids"] == expected.token_ids
    assert streamed == expected.text
    assert final["finish_reason"] == chat_pb2.FinishReason.Name(expected.final.finish_reason)
    assert final["usage"]["generated_tokens"] == expected.final.usage.generated_tokens == len(expected.token_ids)
    assert final["usage"]["prompt_tokens"] == expected.final.usage.prompt_tokens
    assert final["engine_id"] == "e0"


def test_node_client_reports_a_bad_key_as_an_error(stack) -> None:
    node = _require_node()
    result = subprocess.run(
        [node, str(REPO / "clients" / "node" / "chat.mjs"), "--target", stack.address, "--api-key", "not-a-key"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 1
    assert result.stdout.startswith("ERROR UNAUTHENTICATED: authorization")


def test_generic_reflection_lists_and_describes_the_public_api(stack) -> None:
    with grpc.insecure_channel(stack.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {
            "salon.chat.v1.ChatService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= services
        pool = descriptor_pool.DescriptorPool(database)
        generate = pool.FindServiceByName("salon.chat.v1.ChatService").FindMethodByName("Generate")
        assert generate.server_streaming and not generate.client_streaming
        assert generate.input_type.full_name == "salon.chat.v1.GenerateRequest"
        assert set(generate.input_type.fields_by_name) == {
            "conversation_id",
            "request_id",
            "character",
            "dialogue",
            "tokens",
            "text",
            "sampling",
            "model",
        }
