"""The driver against a scripted ChatService on real loopback gRPC: exactly what it sends, and what it measures.

The scripted server answers every turn with known token ids, so the test can check the protocol
byte for byte: the API key, the whole dialogue every turn, replies sent back as the streamed ids
minus trailing EOS, regenerations and edits rewriting the tail, failed turns changing nothing.
(The end-to-end run against the real services is in test_loadgen_e2e.py.)
"""

import grpc
import pytest
from loadgen_scripted import KEY, ScriptedChat, scripted  # noqa: F401 (fixture)

from salon.api.chat.v1 import chat_pb2
from salon.loadgen.driver import DriverConfig, replay
from salon.loadgen.transport_grpc import ChatGrpcTransport
from salon.loadgen.workload import TurnKind, WorkloadConfig, generate_trace


def _trace(prime=None):
    """The test trace; prime=None leaves WorkloadConfig's default (no priming) in force."""
    primed = {} if prime is None else {"prime_history": prime}
    return generate_trace(
        WorkloadConfig(
            seed=3,
            num_dialogues=4,
            num_initial_dialogues=2,
            arrival_rate_per_s=50.0,
            turns_per_dialogue=5,
            history_messages_mean=6,
            regenerate_fraction=0.3,
            edit_fraction=0.3,
            think_s_mean=0.01,
            away_fraction=0.0,
            max_new_tokens=7,
            **primed,
        )
    )


def _body(message):
    return ("ids", tuple(message.token_ids)) if message.token_ids else ("text", message.text)


async def test_driver_sends_whole_dialogue_and_replies_as_token_ids(scripted):
    servicer = ScriptedChat()
    target = await scripted(servicer)
    trace = _trace(prime=True)
    kinds = [t.kind for d in trace.dialogues for t in d.turns]
    assert TurnKind.REGENERATE in kinds and TurnKind.EDIT in kinds  # the seed exercises every kind
    result = await replay(trace, ChatGrpcTransport(target, KEY), DriverConfig(concurrency=3, time_scale=1.0), "cache")

    assert len(result.records) == trace.num_turns and all(r.ok for r in result.records)
    assert result.model_id == "scripted" and result.primed and result.extra["prime_errors"] == []
    # Priming first: one request per dialogue, its history without the last reply, one new token.
    primes = servicer.requests[: len(trace.dialogues)]
    assert sorted(r.request_id for r in primes) == sorted(f"{d.conversation_id}-prime" for d in trace.dialogues)
    for prime in primes:
        spec = next(d for d in trace.dialogues if d.conversation_id == prime.conversation_id)
        assert [m.text for m in prime.dialogue.messages] == [m.text for m in spec.history[:-1]]
        assert prime.sampling.max_new_tokens == 1 and prime.sampling.temperature == 0.0
    by_conv = {}
    for request in servicer.requests[len(trace.dialogues) :]:
        by_conv.setdefault(request.conversation_id, []).append(request)
    for spec in trace.dialogues:
        requests = sorted(by_conv[spec.conversation_id], key=lambda r: r.request_id)
        assert [r.request_id for r in requests] == [f"{spec.conversation_id}-t{i}" for i in range(len(spec.turns))]
        previous = None
        for turn, request in zip(spec.turns, requests):
            msgs = [(m.role, m.author) + _body(m) for m in request.dialogue.messages]
            assert request.character.name == spec.character_name
            assert request.sampling.max_new_tokens == 7 and request.sampling.seed == turn.sampling_seed
            if previous is None:
                assert msgs[:-1] == [
                    (
                        chat_pb2.ROLE_USER if m.role.value == "user" else chat_pb2.ROLE_CHARACTER,
                        m.author,
                        "text",
                        m.text,
                    )
                    for m in spec.history
                ]
            else:
                prev_msgs, prev_reply = previous
                reply = (chat_pb2.ROLE_CHARACTER, spec.character_name, "ids", prev_reply)
                if turn.kind is TurnKind.MESSAGE:
                    assert msgs[:-1] == prev_msgs + [reply]
                elif turn.kind is TurnKind.REGENERATE:
                    assert msgs == prev_msgs
                else:
                    assert msgs[:-1] == prev_msgs[:-1]
            if turn.kind is not TurnKind.REGENERATE:
                assert msgs[-1] == (chat_pb2.ROLE_USER, spec.user_name, "text", turn.user_text)
            n = servicer.requests.index(request) + 1
            previous = (msgs, (500 + n, 600 + n))  # the reply minus its trailing EOS id

    for r in result.records:
        assert r.reply_token_ids[-1] == 106 and r.generated_tokens == 3
        assert r.prompt_tokens > 0 and r.cached_device_tokens == r.prompt_tokens - 10
        assert 5.0 < r.ttft_ms < 2000.0
        assert len(r.itl_ms) == 2 and r.itl_ms[0] == 0.0 and r.itl_ms[1] > 10.0
        assert r.end_s >= r.sent_s and r.finish_reason == "FINISH_REASON_STOP_TOKEN"


async def test_failed_turn_is_recorded_and_the_dialogue_continues_unchanged(scripted):
    trace = _trace()
    spec = trace.dialogues[0]
    servicer = ScriptedChat(fail_request_ids={f"{spec.conversation_id}-t1"})
    target = await scripted(servicer)
    result = await replay(trace, ChatGrpcTransport(target, KEY), DriverConfig(concurrency=8, time_scale=0.0), "cache")
    failed = [r for r in result.records if not r.ok]
    assert [(r.dialogue_index, r.turn_index) for r in failed] == [(0, 1)]
    assert failed[0].error == "RESOURCE_EXHAUSTED: busy" and failed[0].ttft_ms is None
    sent = [
        r
        for r in servicer.requests
        if r.conversation_id == spec.conversation_id and not r.request_id.endswith("-prime")
    ]
    t0, t1, t2 = sent[0], sent[1], sent[2]
    # Turn 2 is built on turn 0's dialogue: turn 1 failed and left nothing behind.
    base = list(t0.dialogue.messages)
    n0 = servicer.requests.index(t0) + 1
    reply0 = chat_pb2.Message(role=chat_pb2.ROLE_CHARACTER, author=spec.character_name, token_ids=[500 + n0, 600 + n0])
    kind2 = spec.turns[2].kind
    if kind2 is TurnKind.MESSAGE:
        assert list(t2.dialogue.messages)[:-1] == base + [reply0]
    elif kind2 is TurnKind.REGENERATE:
        assert list(t2.dialogue.messages) == base
    else:
        assert list(t2.dialogue.messages)[:-1] == base[:-1]
    assert t1.request_id.endswith("-t1")


async def test_unprimed_run_starts_cold(scripted):
    """Nothing is primed by default, and a driver told not to prime does not, even for a priming trace."""
    for trace, driver in (
        (_trace(), DriverConfig(time_scale=0.0)),
        (_trace(prime=True), DriverConfig(time_scale=0.0, prime=False)),
    ):
        servicer = ScriptedChat()
        target = await scripted(servicer)
        result = await replay(trace, ChatGrpcTransport(target, KEY), driver, "no-cache")
        assert not result.primed and all(not r.request_id.endswith("-prime") for r in servicer.requests)
        assert len(servicer.requests) == len(result.records) == trace.num_turns


async def test_wrong_key_fails_fast(scripted):
    target = await scripted(ScriptedChat())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await replay(_trace(), ChatGrpcTransport(target, "wrong-key-0"), DriverConfig(time_scale=0.0), "cache")
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
