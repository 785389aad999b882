"""vLLM's request controls through the official `openai` package (and one gRPC call) against a real stack: one
engine that runs one request at a time (so requests queue), a gateway serving the HTTP API.

ignore_eos and min_tokens give exact token counts, priority reorders the queue, logit_bias bans a token,
prompt lists in /v1/completions, cache_salt's namespaces (within a tenant, never across), echo, unknown
fields ignored, and the same controls on the gRPC API."""

from __future__ import annotations

import threading
import time

import grpc
import openai
import pytest

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from tests.openai.openai_stack import KEY, KEY_LIMITED, MODEL, start_stack, stop_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("vllm"), num_engines=1, engine_flags=("--max-num-running", "1"))
    try:
        yield s
    finally:
        stop_stack(s)


def complete(client, prompt, max_tokens=8, **extra):
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body={"return_token_ids": True, **extra}
    )


def token_ids(choice) -> list[int]:
    return choice.model_extra["token_ids"]


def test_ignore_eos_generates_exactly_max_tokens_past_a_stop_token(stack):
    client = stack.client()
    first = token_ids(complete(stack.client(), "The lighthouse keeper said", 4).choices[0])[0]
    # Making the first greedy token an EOS-like stop ends the reply at once ...
    stopped = complete(client, "The lighthouse keeper said", 4, stop_token_ids=[first])
    assert stopped.usage.completion_tokens == 1 and stopped.choices[0].finish_reason == "stop"
    # ... ignore_eos does not ignore the request's own stop ids (vLLM), but does ignore the model's EOS.
    eos_ids = _eos_ids(stack)
    biased = {str(t): 100 for t in eos_ids[:1]}  # the model's EOS made certain
    ended = complete(client, "The sea was calm.", 6, logit_bias=biased)
    assert ended.usage.completion_tokens == 1 and ended.choices[0].finish_reason == "stop"
    ignored = complete(client, "The sea was calm.", 6, logit_bias=biased, ignore_eos=True)
    assert ignored.usage.completion_tokens == 6 and ignored.choices[0].finish_reason == "length"
    assert token_ids(ignored.choices[0]) == [eos_ids[0]] * 6


def test_min_tokens_masks_stop_tokens_until_reached(stack):
    client = stack.client()
    eos = _eos_ids(stack)[0]
    biased = {str(eos): 100}
    reply = complete(client, "Tell me about waves.", 12, logit_bias=biased, min_tokens=5)
    ids = token_ids(reply.choices[0])
    assert reply.usage.completion_tokens == 6 and ids[-1] == eos and eos not in ids[:5]
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=9,
        temperature=0,
        extra_body={"min_tokens": 9, "logit_bias": biased},
    )
    assert chat.usage.completion_tokens == 9 and chat.choices[0].finish_reason == "length"


def test_logit_bias_minus_100_bans_the_greedy_token(stack):
    client = stack.client()
    base = token_ids(complete(client, "Once upon a time", 8).choices[0])
    banned = complete(client, "Once upon a time", 8, logit_bias={str(base[0]): -100})
    got = token_ids(banned.choices[0])
    assert base[0] not in got and got != base


def test_priority_reorders_queued_requests(stack):
    """One running slot: while a long streamed request runs, a low-priority then a high-priority request queue; the
    high-priority one is admitted first, so it finishes first. The long request runs until the test closes its
    stream (not for a fixed number of tokens a fast host could finish before the others arrive)."""
    done: list[str] = []
    release = threading.Event()

    def hold_the_slot() -> None:
        with stack.client().completions.create(
            model=MODEL,
            prompt="busy " * 4,
            max_tokens=4000,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, "stop_token_ids": []},
        ) as stream:
            for _chunk in stream:
                if release.is_set():
                    break

    busy = threading.Thread(target=hold_the_slot, daemon=True)
    busy.start()
    _wait(lambda: stack.load("e0").running_requests == 1)

    def run(name: str, priority: int) -> None:
        complete(stack.client(), f"{name} request", 4, priority=priority, ignore_eos=True)
        done.append(name)

    low = threading.Thread(target=run, args=("low", 10))
    low.start()
    _wait(lambda: stack.load("e0").waiting_requests == 1)
    high = threading.Thread(target=run, args=("high", -5))
    high.start()
    _wait(lambda: stack.load("e0").waiting_requests == 2)
    assert done == []  # the long request still held the slot while both queued
    release.set()
    for t in (busy, low, high):
        t.join(timeout=120)
    assert not busy.is_alive() and done == ["high", "low"]


def test_prompt_lists_give_n_choices_per_prompt_in_vllm_order(stack):
    client = stack.client()
    prompts = ["The harbour at dawn", "A storm over the cliffs"]
    alone = [token_ids(complete(client, p, 5).choices[0]) for p in prompts]
    both = client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=5, temperature=0, n=2, extra_body={"return_token_ids": True}
    )
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [token_ids(c) for c in both.choices] == [alone[0], alone[0], alone[1], alone[1]]
    assert both.usage.completion_tokens == 20
    ids = client.completions.create(model=MODEL, prompt=[[1, 2, 3], [4, 5, 6]], max_tokens=2, temperature=0)
    assert [c.index for c in ids.choices] == [0, 1] and ids.usage.prompt_tokens == 6


def test_truncate_prompt_tokens_keeps_the_last_tokens(stack):
    client = stack.client()
    long = [5, 17, 29, 41, 53, 65, 77, 89, 101, 113]
    truncated = complete(client, long, 4, truncate_prompt_tokens=4)
    tail = complete(client, long[-4:], 4)
    assert truncated.usage.prompt_tokens == 4 and token_ids(truncated.choices[0]) == token_ids(tail.choices[0])
    assert complete(client, long, 1, truncate_prompt_tokens=-1).usage.prompt_tokens == 10


def test_echo_prepends_the_prompt(stack):
    client = stack.client()
    plain = client.completions.create(model=MODEL, prompt="Gulls circled", max_tokens=4, temperature=0)
    echoed = client.completions.create(model=MODEL, prompt="Gulls circled", max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == "Gulls circled" + plain.choices[0].text
    streamed = client.completions.create(
        model=MODEL, prompt="Gulls circled", max_tokens=4, temperature=0, echo=True, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == echoed.choices[0].text


def test_cache_salt_shares_cached_tokens_only_with_the_same_salt_and_tenant(stack):
    prompt = "The keeper climbed the spiral stair, counting every step of the old stone tower. " * 3

    def cached(key: str, **extra) -> int:
        reply = stack.client(key=key).completions.create(
            model=MODEL, prompt=prompt, max_tokens=1, temperature=0, extra_body=extra
        )
        return reply.usage.prompt_tokens_details.cached_tokens

    assert cached(KEY, cache_salt="alpha") == 0
    assert cached(KEY, cache_salt="alpha") > 0  # the positive control: the same salt hits
    assert cached(KEY, cache_salt="beta") == 0
    assert cached(KEY) == 0  # no salt is a namespace of its own
    assert cached(KEY_LIMITED, cache_salt="alpha") == 0  # another tenant, the same salt


def test_delete_conversation_erases_its_cache_salted_entries(stack):
    prompt = "The lamp turned all night over the black water while the keeper wrote his log. " * 3
    headers = {"x-salon-conversation-id": "salted-dialogue"}

    def cached() -> int:
        reply = stack.client().completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=1,
            temperature=0,
            extra_body={"cache_salt": "gamma"},
            extra_headers=headers,
        )
        return reply.usage.prompt_tokens_details.cached_tokens

    cached()
    assert cached() > 0  # the positive control
    with grpc.insecure_channel(stack.gateway.address) as channel:
        chat_pb2_grpc.ChatServiceStub(channel).DeleteConversation(
            chat_pb2.DeleteConversationRequest(conversation_id="salted-dialogue"),
            metadata=[("authorization", f"Bearer {KEY}")],
            timeout=30,
        )
    assert cached() == 0


def test_unknown_fields_are_ignored_and_vllm_fields_accepted(stack):
    reply = stack.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=3,
        temperature=0,
        user="u-1",
        metadata={"team": "docs"},
        extra_body={
            "a_field_no_server_knows": {},
            "some_future_field": [1, 2],
            "skip_special_tokens": True,
            "spaces_between_special_tokens": False,
            "include_stop_str_in_output": False,
            "truncate_prompt_tokens": 64,
            "chat_template_kwargs": {"enable_thinking": False},
            "stop": None,
            "ignore_eos": False,
        },
    )
    assert reply.usage.completion_tokens >= 1


def test_out_of_bounds_controls_are_400s_naming_the_field(stack):
    client = stack.client()
    cases = [
        (dict(extra_body={"priority": 10**7}), "priority"),
        (dict(extra_body={"logit_bias": {"5": 101}}), "logit_bias.5"),
        (dict(extra_body={"logit_bias": {str(i): 1 for i in range(301)}}), "logit_bias"),
        (dict(extra_body={"min_tokens": 9}), "min_tokens"),
        (dict(extra_body={"cache_salt": "é" * 200}), "cache_salt"),
        (dict(extra_body={"truncate_prompt_tokens": -2}), "truncate_prompt_tokens"),
        (dict(echo=True, logprobs=1), "echo"),
        (dict(prompt=["p"] * 17), "prompt"),
        (dict(prompt=["ok", ""]), "prompt[1]"),
    ]
    for kw, param in cases:
        kw.setdefault("prompt", "Hello")
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=MODEL, max_tokens=4, **kw)
        body = err.value.body if "error" not in (err.value.body or {}) else err.value.body["error"]
        assert err.value.status_code == 400 and body["param"] == param, (kw, body)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
            extra_body={"chat_template_kwargs": {"messages": []}},
        )
    assert "chat_template_kwargs_json: 'messages' cannot be set" in err.value.message


def test_grpc_gets_the_same_controls(stack):
    eos = _eos_ids(stack)[0]
    with grpc.insecure_channel(stack.gateway.address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        request = chat_pb2.GenerateRequest(
            conversation_id="grpc-controls",
            text="The tide came in.",
            sampling=chat_pb2.SamplingParams(
                max_new_tokens=7, temperature=0, logit_bias={eos: 100.0}, ignore_eos=True, min_tokens=3
            ),
            priority=-1,
            cache_salt="grpc",
        )
        events = list(stub.Generate(request, metadata=[("authorization", f"Bearer {KEY}")], timeout=60))
    ids = [t for e in events if e.HasField("delta") for t in e.delta.token_ids]
    final = events[-1].final
    # min_tokens masks the EOS for 3 tokens (even with ignore_eos, as vLLM); then the certain EOS does not end it.
    assert eos not in ids[:3] and ids[3:] == [eos] * 4 and final.usage.generated_tokens == 7
    assert final.finish_reason == chat_pb2.FINISH_REASON_LENGTH


def _eos_ids(stack) -> list[int]:
    with grpc.insecure_channel(stack.gateway.address) as channel:
        info = chat_pb2_grpc.ChatServiceStub(channel).GetModelInfo(
            chat_pb2.GetModelInfoRequest(), metadata=[("authorization", f"Bearer {KEY}")], timeout=10
        )
    return list(info.model.eos_token_ids)


def _wait(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)
