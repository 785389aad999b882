"""Structured output through the official `openai` package against a real SmolLM2-135M stack (one engine, a
gateway serving the HTTP API and the public gRPC API): `.parse()` with a pydantic model (on Gemma 3 270M too,
and through the Responses API), a strict schema with enums, a nested object, arrays and integer bounds sampled
at temperature 1 with 20 seeds, regex and choice through vLLM's fields, json_object on completions, a
constraint over gRPC, and bad constraints refused with a 400 naming them. Without the token mask the 135M model
writes none of these."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import grpc
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from tests.hardening.hardening_stack import start_engine, start_gateway, stop_all, wait_gateway_sees
from tests.openai.openai_stack import KEY, TENANTS

MODEL = "smollm2-135m-instruct"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "mood": {"type": "string", "enum": ["calm", "cheerful", "curious", "wary"]},
        "energy": {"type": "integer", "minimum": 0, "maximum": 100},
        "location": {
            "type": "object",
            "properties": {
                "place": {"type": "string", "enum": ["home", "tavern", "forest"]},
                "floor": {"type": "integer", "minimum": -2, "maximum": 9},
            },
            "required": ["place", "floor"],
            "additionalProperties": False,
        },
        "goals": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 1, "maxItems": 3},
        "hostile": {"type": "boolean"},
    },
    "required": ["name", "mood", "energy", "location", "goals", "hostile"],
    "additionalProperties": False,
}
MESSAGES = [
    {"role": "system", "content": "You are a game master. Describe characters as JSON."},
    {"role": "user", "content": "Describe the innkeeper of the tavern."},
]


class Place(BaseModel):
    place: Literal["home", "tavern", "forest"]
    floor: int = Field(ge=-2, le=9)


class CharacterState(BaseModel):
    name: str = Field(max_length=24)
    mood: Literal["calm", "cheerful", "curious", "wary"]
    location: Place
    hostile: bool


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("structured")
    engine = gateway = None
    try:
        engine = start_engine("e0", tmp, extra=["--model", MODEL])
        tenants = tmp / "tenants.json"
        tenants.write_text(json.dumps(TENANTS))
        gateway = start_gateway({"e0": engine}, tenants, tmp, extra=["--http-port", "0"])
        wait_gateway_sees(gateway, 1)
        yield gateway
    finally:
        stop_all([gateway, engine])


@pytest.fixture(scope="module")
def client(stack):
    url = f"http://127.0.0.1:{stack.extra_ports['http_port']}/v1"
    return openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def gemma_client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("structured-gemma")
    engine = gateway = None
    try:
        engine = start_engine("g0", tmp, extra=["--model", "gemma-3-270m"])
        tenants = tmp / "tenants.json"
        tenants.write_text(json.dumps(TENANTS))
        gateway = start_gateway({"g0": engine}, tenants, tmp, extra=["--http-port", "0"])
        wait_gateway_sees(gateway, 1)
        url = f"http://127.0.0.1:{gateway.extra_ports['http_port']}/v1"
        yield openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=300)
    finally:
        stop_all([gateway, engine])


@pytest.mark.parametrize("model", [MODEL, "gemma-3-270m"])
def test_parse_with_a_pydantic_model(request, model):
    client = request.getfixturevalue("client" if model == MODEL else "gemma_client")
    completion = client.chat.completions.parse(
        model=model, messages=MESSAGES, response_format=CharacterState, max_tokens=200, seed=7
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, CharacterState)
    assert CharacterState.model_validate_json(choice.message.content) == choice.message.parsed


def test_responses_parse_with_a_pydantic_model(client):
    response = client.responses.parse(
        model=MODEL,
        instructions=MESSAGES[0]["content"],
        input=MESSAGES[1]["content"],
        text_format=CharacterState,
        max_output_tokens=200,
        temperature=0,
    )
    assert isinstance(response.output_parsed, CharacterState)
    assert CharacterState.model_validate_json(response.output_text) == response.output_parsed


def test_a_strict_schema_holds_for_twenty_seeds_at_temperature_one(client):
    def reply(seed: int):
        return client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            temperature=1.0,
            seed=seed,
            max_tokens=300,
            response_format={"type": "json_schema", "json_schema": {"name": "state", "schema": SCHEMA, "strict": True}},
        ).choices[0]

    with ThreadPoolExecutor(8) as pool:
        choices = list(pool.map(reply, range(20)))
    for seed, choice in enumerate(choices):
        assert choice.finish_reason == "stop", (seed, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert len({c.message.content for c in choices}) > 1  # sampled, not one forced text


def test_regex_and_choice_through_vllm_fields_and_json_object_on_completions(client):
    regex = r"[A-Z][a-z]{2,8} (the )?(Brave|Quiet|Old)"
    for body in ({"guided_regex": regex}, {"structured_outputs": {"regex": regex}}):
        text = (
            client.chat.completions.create(
                model=MODEL, messages=MESSAGES, temperature=1.0, seed=3, max_tokens=40, extra_body=body
            )
            .choices[0]
            .message.content
        )
        assert re.fullmatch(regex, text), (body, text)
    choices = ["yes", "no", "maybe later"]
    for seed in range(4):
        text = (
            client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                temperature=1.0,
                seed=seed,
                max_tokens=10,
                extra_body={"guided_choice": choices},
            )
            .choices[0]
            .message.content
        )
        assert text in choices
    completion = client.completions.create(
        model=MODEL,
        prompt='Character: {"name": "Bo", "age": 31}\nCharacter: {"name": "Li", "age": 8}\nCharacter:',
        temperature=0,
        max_tokens=200,
        extra_body={"response_format": {"type": "json_object"}},
    ).choices[0]
    assert completion.finish_reason == "stop", completion.text
    assert isinstance(json.loads(completion.text), dict)


LARK = r"""
start: greeting " " NAME "!"  // Lark, not GBNF: told apart as vLLM does
greeting: "hello"i | "hi"
NAME: /[A-Z][a-z]{1,8}/
"""


def test_a_lark_grammar_through_vllm_fields(client):
    for body in ({"structured_outputs": {"grammar": LARK}}, {"guided_grammar": LARK}):
        for seed in range(2):
            choice = client.chat.completions.create(
                model=MODEL, messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=30, extra_body=body
            ).choices[0]
            assert choice.finish_reason == "stop", (body, choice.message.content)
            assert re.fullmatch(r"([Hh][Ee][Ll][Ll][Oo]|hi) [A-Z][a-z]{1,8}!", choice.message.content), body


def test_a_constraint_over_grpc(stack):
    with grpc.insecure_channel(stack.address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        request = chat_pb2.GenerateRequest(
            conversation_id="structured-grpc",
            dialogue=chat_pb2.Dialogue(messages=[chat_pb2.Message(role=chat_pb2.ROLE_USER, text="Pick a door.")]),
            sampling=chat_pb2.SamplingParams(
                max_new_tokens=10,
                temperature=1.0,
                seed=2,
                constraint=chat_pb2.Constraint(choice=chat_pb2.Choice(choices=["red door", "blue door"])),
            ),
        )
        events = list(stub.Generate(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=60))
        text = "".join(e.delta.text for e in events if e.HasField("delta"))
        assert text in ("red door", "blue door")
        assert events[-1].final.finish_reason == chat_pb2.FINISH_REASON_STOP_TOKEN
        request.sampling.constraint.regex = "(unclosed"
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Generate(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=60))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sampling.constraint.regex: does not compile" in refused.value.details()


@pytest.mark.parametrize(
    ("body", "param", "named"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
            "response_format",
            "response_format: does not compile",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
            "response_format.json_schema.schema: is required",
        ),
        ({"response_format": {"type": "grammar"}}, "response_format.type", "response_format.type"),
        ({"guided_regex": "(unclosed"}, "guided_regex", "guided_regex: does not compile"),
        ({"guided_grammar": "root ::= missing_rule"}, "guided_grammar", "guided_grammar: does not compile"),
        (
            {"guided_grammar": 'start: "a"\nfoo: ( "b"'},
            "guided_grammar",
            "guided_grammar: Lark line 2: expected ')' to close the group",
        ),
        (
            {"structured_outputs": {"grammar": "start: /^a/"}},
            "structured_outputs",
            "structured_outputs: Lark line 1: regex /^a/ at position 0: anchor",
        ),
        ({"guided_choice": []}, "guided_choice", "guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "structured_outputs"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "guided_choice"),
        (  # a forced call's schema is the tools' (the engine compiles it as the request's constraint)
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"a": {"$ref": "#/x"}}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
            "tools: does not compile",
        ),
    ],
)
def test_bad_constraints_are_400_naming_the_problem(client, body, param, named):
    """Each refusal names the request's field, those the engine makes (the constraint does not compile) too."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, extra_body=body)
    assert refused.value.body["param"] == param, refused.value.body
    assert refused.value.body["message"].startswith(named), refused.value.body
