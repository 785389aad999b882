"""Exactness of the cross-turn cache on the default model (Gemma 3 270M, int8).

A reply generated with a cache hit — from the engine's own memory or from host KV written into fresh
blocks — is token-for-token the reply of an engine with no cache, including hits that end inside the
512-token sliding window and a partial match after an edited last message. Prompts are ~600+
tokens, so every case crosses the window.
"""

from __future__ import annotations

import pytest

from salon.common.prefix_hash import namespace_digest
from salon.engine.api.prompt import Character, ChatMessage, PromptRenderer, Role
from salon.engine.model.chat_renderer import ChatRenderer
from salon.engine.prefix.hit import host_hit
from salon.engine.worker.model_loading import load_model
from tests.engine_testlib import BLOCK_SIZE_TOKENS as BS
from tests.engine_testlib import make_core, make_request, run_one
from tests.model.conftest import reference_path

NS = namespace_digest("gemma-3-270m", "test", "tenant")


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma-3-270m", "int8")


def core_for(gemma, caching=True):
    return make_core(gemma, budget=256, kv_bytes=64 << 20, max_running=16, max_waiting=64, prefix_caching=caching)


def paragraphs():
    text = reference_path("gpl-3.txt").read_text()
    parts = [p.strip().replace("\n", " ") for p in text.split("\n\n") if len(p.strip()) > 200]
    assert len(parts) >= 24, "the reference text is needed for these prompts"
    return parts


def render(gemma, messages):
    _model, tok = gemma
    renderer = PromptRenderer(ChatRenderer(tok, None, (1, 106, 212)))
    rendered = renderer.render_prompt(Character("Lex", "Lex explains software licences in plain words."), messages)
    return rendered.token_ids, rendered.last_message_start


def run(core, prompt, retain_from=None, namespace=NS, host=None, max_new=16):
    r = make_request(
        f"r{id(prompt)}-{len(prompt)}",
        prompt,
        max_new,
        namespace=namespace,
        retain_from=retain_from,
        stop_token_ids=frozenset({1, 106, 212}),
        max_context_tokens=32768,
    )
    return run_one(core, r, host), r


def reference(gemma, prompt, max_new=16):
    return run(core_for(gemma, caching=False), prompt, namespace=None, max_new=max_new)[0]


def test_device_and_host_hits_match_no_cache_on_gemma(gemma):
    paras = paragraphs()
    history = [
        ChatMessage(Role.USER if i % 2 == 0 else Role.CHARACTER, text=paras[i], author="u" if i % 2 == 0 else "")
        for i in range(9)
    ]
    prompt1, last1 = render(gemma, history)
    assert len(prompt1) > 560
    producer = core_for(gemma)
    puts = []
    producer.set_host_sink(puts.append)
    reply, r1 = run(producer, prompt1, retain_from=max(0, last1 - 512 - BS))
    assert reply == reference(gemma, prompt1)

    # Next turn on the same engine: a device hit that ends far past the window's start.
    body = tuple(t for t in reply if t != 106)
    turn2 = history + [
        ChatMessage(Role.CHARACTER, token_ids=body),
        ChatMessage(Role.USER, author="u", text="Can you say that in one sentence?"),
    ]
    prompt2, last2 = render(gemma, turn2)
    assert prompt2[: len(prompt1) + len(body)] == prompt1 + list(body)
    out2, r2 = run(producer, prompt2, retain_from=max(0, last2 - 512 - BS))
    assert r2.num_cached_device_tokens == r1.num_computed_tokens > 512  # on into turn 1's last block
    assert out2 == reference(gemma, prompt2)

    # The same turn on another engine, from the host KV of turn 1 (what the kvstore stores).
    put = puts[0]
    n_blocks = len(put.token_ids) // BS
    window_blocks = -(-(512 - 1) // BS)
    local_first = n_blocks - window_blocks
    assert put.local_first_block <= local_first
    host = host_hit(n_blocks * BS, put.global_kv, put.local_kv[local_first - put.local_first_block :], local_first)
    out3, r3 = run(core_for(gemma), prompt2, retain_from=max(0, last2 - 512 - BS), host=host)
    assert r3.num_cached_host_tokens == n_blocks * BS
    assert out3 == out2


def test_edited_last_message_reuses_a_partial_match_on_gemma(gemma):
    paras = paragraphs()
    history = [
        ChatMessage(Role.USER if i % 2 == 0 else Role.CHARACTER, text=paras[10 + i], author="u" if i % 2 == 0 else "")
        for i in range(10)
    ]
    last = ChatMessage(Role.USER, author="u", text=paras[22][:400])
    prompt, last_start = render(gemma, history + [last])
    core = core_for(gemma)
    retain = max(0, last_start - 512 - BS)
    run(core, prompt, retain_from=retain)
    edited_msg = ChatMessage(
        Role.USER, author="u", text=paras[22][:120] + " Actually, never mind that: what is a patent?"
    )
    edited, edited_start = render(gemma, history + [edited_msg])
    assert edited_start == last_start
    common = next(i for i, (a, b) in enumerate(zip(prompt, edited)) if a != b)
    out, r = run(core, edited, retain_from=retain)
    # The hit ends inside the edited message, more than a window after the start of the context.
    assert last_start > 512
    assert r.num_cached_device_tokens == common > last_start  # on into the block the edit begins inside
    assert out == reference(gemma, edited)
