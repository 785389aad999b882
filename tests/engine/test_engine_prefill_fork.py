"""The other choices of an n > 1 completion start from a copy of the first choice's prompt KV
(prefix/fork.py): the shared prompt is computed once, and every choice's tokens equal the tokens it
gets when run alone (synthetic-tiny has sliding-window layers, so the copy's window rule is exercised)."""

from __future__ import annotations

import pytest

from salon.engine.request import RequestId
from salon.engine.worker.model_loading import load_model
from tests.engine_testlib import blocks_accounted, make_core, make_request, run_one, tokens

NAMESPACE = b"ns-fork"
PROMPT = tokens(150, seed=11)


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model("synthetic-tiny", "int8")


def record_chunks(core) -> list[tuple[str, int]]:
    """(request id, tokens computed) of every chunk the scheduler hands out from now on."""
    seen: list[tuple[str, int]] = []
    schedule = core.scheduler.schedule

    def spy():
        out = schedule()
        seen.extend((c.request.request_id, c.num_tokens) for c in out.chunks)
        return out

    core.scheduler.schedule = spy
    return seen


def step_until_first_token(core, request_id: str, out: dict[str, list[int]]) -> None:
    while not out.get(request_id):
        for e in core.step():
            out.setdefault(e.request_id, []).extend(e.token_ids)


def finish(core, out: dict[str, list[int]]) -> None:
    while core.has_work():
        for e in core.step():
            out.setdefault(e.request_id, []).extend(e.token_ids)


def choice(rid: str, **sampling):
    return make_request(rid, PROMPT, 20, namespace=NAMESPACE, **sampling)


def test_a_second_choice_copies_the_prompt_kv_and_computes_only_the_tail(model_and_tokenizer):
    alone_greedy = run_one(make_core(model_and_tokenizer), choice("ref0"))
    alone_sampled = run_one(make_core(model_and_tokenizer), choice("ref1", temperature=1.0, seed=7))
    core = make_core(model_and_tokenizer)
    chunks = record_chunks(core)
    out: dict[str, list[int]] = {}
    core.add(choice("c0"))
    step_until_first_token(core, "c0", out)
    child = choice("c1", temperature=1.0, seed=7)
    core.add(child, prefill_from=RequestId("c0"))
    finish(core, out)
    # 150 tokens: 9 whole blocks (144 tokens) are copied, the child computes the 6 after them.
    assert child.num_cached_device_tokens == 144 and child.num_cached_host_tokens == 0
    child_prompt_chunks = [n for rid, n in chunks if rid == "c1"]
    assert child_prompt_chunks[0] == 6
    assert sum(n for rid, n in chunks if rid == "c0") == 150 + 19  # the prompt once, then 19 decodes
    assert out["c0"] == alone_greedy
    assert out["c1"] == alone_sampled
    assert blocks_accounted(core)


def test_no_copy_from_a_request_that_has_not_computed_its_prompt(model_and_tokenizer):
    alone = run_one(make_core(model_and_tokenizer), choice("ref"))
    core = make_core(model_and_tokenizer)
    core.add(choice("c0"))  # queued, not yet run
    child = choice("c1")
    core.add(child, prefill_from=RequestId("c0"))
    out: dict[str, list[int]] = {}
    finish(core, out)
    assert child.num_cached_device_tokens == 0
    assert out["c0"] == out["c1"] == alone
    assert blocks_accounted(core)


def test_no_copy_across_namespaces(model_and_tokenizer):
    core = make_core(model_and_tokenizer)
    out: dict[str, list[int]] = {}
    core.add(choice("c0"))
    step_until_first_token(core, "c0", out)
    other = make_request("c1", PROMPT, 20, namespace=b"another-tenant")
    core.add(other, prefill_from=RequestId("c0"))
    finish(core, out)
    assert other.num_cached_device_tokens == 0 and other.num_cached_host_tokens == 0
