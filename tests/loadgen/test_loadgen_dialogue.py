"""Regenerations and edits rewrite the tail of the dialogue; replies go back as token ids."""

import pytest

from salon.api.chat.v1 import chat_pb2
from salon.loadgen.dialogue import EMPTY_REPLY_TEXT, DialogueState, strip_trailing_eos
from salon.loadgen.driver import turn_request
from salon.loadgen.transport_grpc import to_proto_request
from salon.loadgen.workload import (
    DialogueSpec,
    HistoryMessage,
    Role,
    TurnAction,
    TurnKind,
    WorkloadConfig,
    generate_trace,
)

U, C = Role.USER, Role.CHARACTER


def _spec(turns):
    history = (HistoryMessage(U, "Bo", "hello there."), HistoryMessage(C, "Ada", "Hi Bo."))
    return DialogueSpec(0, "conv-0", "Ada", "Ada is kind.", "Bo", 0.0, history, tuple(turns))


def _shape(messages):
    return [(m.role, m.text, m.token_ids) for m in messages]


def test_message_regenerate_edit_sequence():
    turns = [
        TurnAction(TurnKind.MESSAGE, 0.0, "first question?", 1),
        TurnAction(TurnKind.REGENERATE, 0.5, None, 2),
        TurnAction(TurnKind.EDIT, 0.5, "edited question?", 3),
        TurnAction(TurnKind.MESSAGE, 0.5, "next one.", 4),
    ]
    state = DialogueState(_spec(turns))
    sent = state.begin_turn(turns[0])
    assert _shape(sent) == [(U, "hello there.", None), (C, "Hi Bo.", None), (U, "first question?", None)]
    state.finish_turn([10, 11])
    sent = state.begin_turn(turns[1])  # the reply (10, 11) is dropped: the same prompt again
    assert _shape(sent) == [(U, "hello there.", None), (C, "Hi Bo.", None), (U, "first question?", None)]
    state.finish_turn([12])
    sent = state.begin_turn(turns[2])  # reply and user message replaced by the edited message
    assert _shape(sent) == [(U, "hello there.", None), (C, "Hi Bo.", None), (U, "edited question?", None)]
    state.finish_turn([13, 14, 15])
    sent = state.begin_turn(turns[3])
    assert _shape(sent) == [
        (U, "hello there.", None),
        (C, "Hi Bo.", None),
        (U, "edited question?", None),
        (C, None, (13, 14, 15)),
        (U, "next one.", None),
    ]
    assert all(m.author == ("Bo" if m.role is U else "Ada") for m in sent)


def test_failed_turn_leaves_the_dialogue_unchanged():
    turns = [TurnAction(TurnKind.EDIT, 0.0, "changed.", 1), TurnAction(TurnKind.MESSAGE, 0.0, "again.", 2)]
    state = DialogueState(_spec(turns))
    before = list(state.messages)
    state.begin_turn(turns[0])
    state.abort_turn()
    assert state.messages == before
    state.begin_turn(turns[1])
    with pytest.raises(RuntimeError, match="in flight"):
        state.begin_turn(turns[1])


def test_empty_reply_is_sent_as_placeholder_text():
    turns = [TurnAction(TurnKind.MESSAGE, 0.0, "q.", 1)]
    state = DialogueState(_spec(turns))
    state.begin_turn(turns[0])
    state.finish_turn([])
    assert (state.messages[-1].text, state.messages[-1].token_ids) == (EMPTY_REPLY_TEXT, None)


def test_strip_trailing_eos():
    assert strip_trailing_eos([5, 106, 7, 106, 1], {1, 106}) == [5, 106, 7]
    assert strip_trailing_eos([106], {106}) == []
    assert strip_trailing_eos([], {106}) == []


def test_fit_context_drops_oldest_pairs():
    trace = generate_trace(WorkloadConfig(seed=1, num_dialogues=1, num_long_dialogues=1, long_history_messages=400))
    state = DialogueState(trace.dialogues[0])
    dropped = state.fit_context(max_context_tokens=4096, max_new_tokens=24)
    assert dropped > 0 and dropped % 2 == 0
    assert len(state.messages) == 400 - dropped
    assert state.messages[0].role is U and state.messages[-1].role is C
    assert state.messages[-1].text == trace.dialogues[0].history[-1].text
    assert DialogueState(trace.dialogues[0]).fit_context(max_context_tokens=32768, max_new_tokens=24) == 0


def test_request_carries_text_history_and_token_id_replies():
    turns = [TurnAction(TurnKind.MESSAGE, 0.0, "q1.", 1), TurnAction(TurnKind.MESSAGE, 0.0, "q2.", 99)]
    spec = _spec(turns)
    state = DialogueState(spec)
    state.begin_turn(turns[0])
    state.finish_turn([7, 8])
    request = to_proto_request(
        turn_request(spec, state.begin_turn(turns[1]), turns[1], 1, WorkloadConfig(max_new_tokens=5))
    )
    assert request.conversation_id == "conv-0" and request.request_id == "conv-0-t1"
    assert request.character.name == "Ada" and request.character.definition == "Ada is kind."
    assert request.sampling.max_new_tokens == 5 and request.sampling.seed == 99
    roles = [m.role for m in request.dialogue.messages]
    assert roles == [chat_pb2.ROLE_USER, chat_pb2.ROLE_CHARACTER] * 2 + [chat_pb2.ROLE_USER]
    assert list(request.dialogue.messages[3].token_ids) == [7, 8] and request.dialogue.messages[3].text == ""
    assert request.dialogue.messages[1].text == "Hi Bo." and not request.dialogue.messages[1].token_ids
