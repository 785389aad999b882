"""The official `openai` Python package against a running stack (two engines, a gateway serving the
HTTP API): chat streamed and not, the second turn's cached tokens, n choices prefilled once, logprobs,
stop strings, penalties, text and token-id completions, tokenize/detokenize, and every error status."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.hardening.hardening_stack import is_clean, start_gateway, stop_all
from tests.openai.openai_stack import KEY, KEY_LIMITED, MODEL, start_stack, stop_stack

SYSTEM = "You are Ada, a lighthouse keeper who answers in short sentences."


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("openai"))
    try:
        yield s
    finally:
        stop_stack(s)


def opening(tag: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Hello from {tag}! How is the sea?"}]


def greedy(client, messages, max_tokens=12, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, **kw)


def metric(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_chat_completion_streamed_equals_not_streamed(stack):
    client = stack.client()
    messages = opening("stream")
    whole = greedy(client, messages)
    assert whole.object == "chat.completion" and whole.model == MODEL
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 12 and whole.usage.prompt_tokens > 0
    chunks = list(greedy(client, messages, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_second_turn_of_a_stateless_dialogue_reports_cached_tokens(stack):
    client = stack.client()
    messages = opening("two turns")
    first = greedy(client, messages).choices[0].message.content
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "And the lamp?"}]
    second = greedy(client, messages)
    details = second.usage.prompt_tokens_details
    assert details.cached_tokens > 0
    by_source = details.model_extra["cached_tokens_by_source"]
    assert by_source["device"] + by_source["host"] == details.cached_tokens
    # The whole first turn (prompt + reply) is cached, cut to whole 16-token blocks.
    first_turn = greedy(client, opening("two turns")).usage
    assert details.cached_tokens >= (first_turn.prompt_tokens + first_turn.completion_tokens) // 16 * 16 - 16


def test_n_choices_share_one_prefill_and_match_single_runs(stack):
    client = stack.client()
    messages = opening("n choices") + [{"role": "user", "content": "Tell me a long story about the storm " * 6}]
    kw = dict(model=MODEL, messages=messages, max_tokens=10, temperature=1.0, seed=1234)
    before = {
        e: metric(stack.engine_metrics(e), "salon_engine_prefix_cache_hits_total", source="device")
        for e in stack.engines
    }
    both = client.chat.completions.create(n=2, **kw)
    after = {
        e: metric(stack.engine_metrics(e), "salon_engine_prefix_cache_hits_total", source="device")
        for e in stack.engines
    }
    assert [c.index for c in both.choices] == [0, 1]
    assert both.usage.completion_tokens == 20
    # Choice 1 copied choice 0's prompt KV: the device hits grew by its whole prompt blocks.
    prompt_blocks_tokens = (both.usage.prompt_tokens - 1) // 16 * 16
    assert sum(after.values()) - sum(before.values()) >= prompt_blocks_tokens
    one = client.chat.completions.create(**kw)
    assert both.choices[0].message.content == one.choices[0].message.content
    kw["seed"] = 1235
    other = client.chat.completions.create(**kw)
    assert both.choices[1].message.content == other.choices[0].message.content


def test_logprobs_with_top_alternatives(stack):
    client = stack.client()
    r = greedy(client, opening("logprobs"), max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        top = entry.top_logprobs
        assert len(top) == 3
        assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert entry.logprob == pytest.approx(top[0].logprob, abs=1e-6)  # greedy takes the argmax
        assert entry.logprob <= 0
    assert "".join(bytes(e.bytes).decode("utf-8", "replace") for e in content) == r.choices[0].message.content


def test_stop_string_ends_the_reply_before_it(stack):
    client = stack.client()
    messages = opening("stop")
    text = greedy(client, messages, max_tokens=16).choices[0].message.content
    assert len(text) > 6
    stop = text[3:6]
    cut = text[: text.index(stop)]
    r = greedy(client, messages, max_tokens=16, stop=[stop])
    assert r.choices[0].message.content == cut
    assert r.choices[0].finish_reason == "stop"


def test_penalties_and_vllm_extensions_are_accepted_and_checked(stack):
    client = stack.client()
    r = client.chat.completions.create(
        model=MODEL,
        messages=opening("penalties"),
        max_tokens=4,
        temperature=0.7,
        seed=3,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        extra_body={"repetition_penalty": 1.1, "min_p": 0.05, "top_k": 20},
    )
    assert r.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=opening("p"), presence_penalty=3.0)
    assert err.value.body["param"] == "presence_penalty"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=opening("p"), extra_body={"min_p": 1.5})
    assert err.value.body["param"] == "min_p"


def test_text_and_token_id_completions_and_tokenize_roundtrip(stack):
    client = stack.client()
    prompt = "The lighthouse at the end of the pier"
    by_text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    assert by_text.object == "text_completion" and by_text.choices[0].finish_reason == "length"
    headers = {"authorization": f"Bearer {KEY}"}
    tokenized = httpx.post(
        f"{stack.http_url}/tokenize", json={"model": MODEL, "prompt": prompt}, headers=headers
    ).json()
    assert set(tokenized) == {"count", "max_model_len", "tokens", "token_strs"}
    assert tokenized["count"] == len(tokenized["tokens"]) == by_text.usage.prompt_tokens
    by_ids = client.completions.create(model=MODEL, prompt=tokenized["tokens"], max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    back = httpx.post(
        f"{stack.http_url}/detokenize", json={"model": MODEL, "tokens": tokenized["tokens"][1:]}, headers=headers
    ).json()
    assert back == {"prompt": prompt}
    chat_tokens = httpx.post(
        f"{stack.http_url}/tokenize", json={"model": MODEL, "messages": opening("tok")}, headers=headers
    ).json()
    assert chat_tokens["count"] == greedy(client, opening("tok"), max_tokens=1).usage.prompt_tokens
    logprobs = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
    lp = logprobs.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == logprobs.choices[0].text and lp.text_offset[0] == 0


def test_models_lists_the_served_model(stack):
    models = stack.client().models.list().data
    assert [m.id for m in models] == [MODEL]
    assert stack.client().models.retrieve(MODEL).id == MODEL
    assert httpx.get(f"{stack.http_url}/health").status_code == 200


def _error(exc_info) -> dict:
    body = exc_info.value.body
    assert set(body) == {"message", "type", "param", "code"}
    return body


def test_error_statuses(stack, tmp_path):
    client = stack.client()
    with pytest.raises(openai.AuthenticationError) as err:
        stack.client(key="sk-not-a-tenant-key").chat.completions.create(model=MODEL, messages=opening("401"))
    assert err.value.status_code == 401 and _error(err)["code"] == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=opening("404"))
    assert err.value.status_code == 404 and _error(err)["param"] == "model" and MODEL in _error(err)["message"]
    cases = [
        (dict(temperature=5), "temperature"),
        (dict(tools=[{"type": "function", "function": {"name": "f g"}}]), "tools[0].function.name"),
        (dict(functions=[{"name": "f"}]), "functions"),
        (dict(extra_body={"min_tokens": -1}), "min_tokens"),
        (dict(extra_body={"logit_bias": {"x": 1}}), "logit_bias.x"),
        (
            dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
            "response_format.json_schema.schema",
        ),
        (dict(response_format={"type": "grammar"}), "response_format.type"),
        (dict(extra_body={"guided_json": []}), "guided_json"),
        (dict(n=0), "n"),
        (dict(top_logprobs=2), "top_logprobs"),
        (
            dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
            "messages[0].content[0].type",
        ),
        (dict(messages=[{"role": "user", "content": "x", "tool_call_id": "1"}]), "messages[0].tool_call_id"),
        (dict(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
        (dict(messages=[{"role": "function", "content": "x", "name": "f"}]), "messages[0].role"),
    ]
    for kw, param in cases:
        kw.setdefault("messages", opening("400"))
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=MODEL, **kw)
        body = _error(err)
        assert err.value.status_code == 400 and body["param"] == param, (kw, body)
        assert body["message"].startswith(param), body
    limited = stack.client(key=KEY_LIMITED)
    limited.chat.completions.create(model=MODEL, messages=opening("429"), max_tokens=1)
    with pytest.raises(openai.RateLimitError) as err:
        limited.chat.completions.create(model=MODEL, messages=opening("429"), max_tokens=1)
    headers = err.value.response.headers
    assert err.value.status_code == 429 and int(headers["retry-after"]) >= 1 and int(headers["retry-after-ms"]) > 0
    assert _error(err)["code"] == "rate_limit_exceeded"
    # A gateway whose only engine is gone: 503.
    dead = start_gateway(
        {"e9": _Dead()}, stack.tenants_path, tmp_path, name="gw-dead", extra=["--http-port", "0"], wait=False
    )
    try:
        dead_client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{dead.extra_ports['http_port']}/v1", api_key=KEY, max_retries=0
        )
        with pytest.raises(openai.InternalServerError) as err:
            dead_client.chat.completions.create(model=MODEL, messages=opening("503"))
        assert err.value.status_code == 503 and _error(err)["code"] == "no_engine"
        assert httpx.get(f"http://127.0.0.1:{dead.extra_ports['http_port']}/health").status_code == 503
    finally:
        stop_all([dead])


class _Dead:
    """An engine address nothing listens on."""

    address = "127.0.0.1:9"


def test_closing_the_stream_aborts_the_engine_work(stack):
    client = stack.client()
    with client.chat.completions.create(
        model=MODEL, messages=opening("cancel"), max_tokens=2000, temperature=0, stream=True
    ) as stream:
        received = 0
        for _chunk in stream:
            received += 1
            if received == 4:
                break
        loads = {e: stack.load(e) for e in stack.engines}
        serving = [e for e, load in loads.items() if load.running_requests == 1]
        assert len(serving) == 1, loads
    deadline = time.monotonic() + 10
    while not is_clean(stack.load(serving[0])):
        assert time.monotonic() < deadline, stack.load(serving[0])
        time.sleep(0.05)
    load = stack.load(serving[0])
    assert load.running_requests == 0 and load.free_kv_blocks + load.cached_kv_blocks == load.total_kv_blocks
    aborted = metric(stack.engine_metrics(serving[0]), "vllm:request_success_total", finished_reason="abort")
    assert aborted >= 1


def test_curl_sse_example_from_the_readme(stack):
    readme = (__import__("pathlib").Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"<!-- curl-sse-example -->\n```bash\n(.*?)```", readme, re.S)
    assert block, "README: the curl SSE example block is missing"
    command = block.group(1).replace("127.0.0.1:8000", f"127.0.0.1:{stack.gateway.extra_ports['http_port']}")
    command = command.replace("salon-dev-key", KEY).replace('"model": "smollm2-135m-instruct"', f'"model": "{MODEL}"')
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, check=True).stdout
    events = [line for line in out.splitlines() if line]
    assert all(line.startswith("data: ") for line in events), out
    assert events[-1] == "data: [DONE]"
    assert '"object":"chat.completion.chunk"' in events[0]
    assert '"usage":{"prompt_tokens"' in events[-2]


def test_grpc_python_example_from_the_readme(stack):
    readme = (__import__("pathlib").Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"<!-- grpc-python-example -->\n```python\n(.*?)```", readme, re.S)
    assert block, "README: the Python gRPC example block is missing"
    code = block.group(1).replace("127.0.0.1:50051", stack.gateway.address).replace("salon-dev-key", KEY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.fullmatch(r"\[\d+ prompt tokens, \d+ cached, [1-9]\d* generated\]", out.splitlines()[-1]), out


def _turns(client, messages: list[dict], num_turns: int, headers: dict | None = None) -> list[str]:
    """Play num_turns turns of a stateless dialogue; the engine that served each."""
    engines = []
    for turn in range(num_turns):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=4, temperature=0, extra_headers=headers or {}
        )
        engines.append(raw.headers["x-salon-engine-id"])
        reply = raw.parse().choices[0].message.content
        messages = messages + [{"role": "assistant", "content": reply}, {"role": "user", "content": f"Go on ({turn})."}]
    return engines


def test_stateless_turns_stay_on_one_engine_and_different_openings_spread(stack):
    client = stack.client()
    homes = {}
    for k in range(8):
        messages = [{"role": "system", "content": f"You are character number {k}."}, {"role": "user", "content": "Hi!"}]
        engines = _turns(client, messages, 3)
        assert len(set(engines)) == 1, (k, engines)
        homes[k] = engines[0]
    assert set(homes.values()) == set(stack.engines), homes


def test_a_conversation_id_header_names_the_dialogue(stack):
    client = stack.client()
    engines = []
    for k in range(4):  # different openings, one named dialogue: one engine
        messages = [{"role": "system", "content": f"Opening {k}."}, {"role": "user", "content": "Hi!"}]
        engines += _turns(client, messages, 1, headers={"x-salon-conversation-id": "named-dialogue-7"})
    assert len(set(engines)) == 1, engines
