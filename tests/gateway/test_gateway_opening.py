"""The routing key of a stateless dialogue (routing.py): the chained hash of its opening."""

from salon.api.chat.v1 import chat_pb2
from salon.common.prefix_hash import ROOT_PARENT, chain_hash
from salon.gateway.http.convert import chat_dialogue
from salon.gateway.http.schemas import ChatMessage
from salon.gateway.routing import opening_conversation_id, render_opening


def messages(*pairs):
    return [ChatMessage(role=r, content=c) for r, c in pairs]


def key(*pairs, salt="s", max_bytes=2048):
    _, _, opening = chat_dialogue(messages(*pairs))
    return opening_conversation_id(salt, opening, max_bytes)


def test_every_turn_of_a_dialogue_has_the_key_of_its_opening():
    turn1 = key(("system", "You are Ada."), ("user", "Hi"))
    turn2 = key(("system", "You are Ada."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "How are you?"))
    assert turn1 == turn2 and turn1.startswith("~opening/")


def test_a_different_opening_tenant_or_first_message_changes_the_key():
    base = key(("system", "You are Ada."), ("user", "Hi"))
    assert key(("system", "You are Bob."), ("user", "Hi")) != base
    assert key(("system", "You are Ada."), ("user", "Hey")) != base
    assert key(("system", "You are Ada."), ("user", "Hi"), salt="other-tenant") != base
    # A greeting by the character before the first user message is not part of the opening.
    assert key(("system", "You are Ada."), ("assistant", "Welcome!"), ("user", "Hi")) == base


def test_the_key_is_the_chained_block_hash_of_the_rendered_opening():
    opening = render_opening([("system", "You are Ada."), ("user", "\nHi")])
    parent = ROOT_PARENT
    for start in range(0, len(opening), 64):
        parent = chain_hash(b"s", parent, opening[start : start + 64])
    assert key(("system", "You are Ada."), ("user", "Hi")) == "~opening/" + parent.hex()


def test_only_the_first_max_bytes_count_and_zero_turns_it_off():
    long_a = key(("system", "x" * 3000 + "a"), ("user", "Hi"))
    long_b = key(("system", "x" * 3000 + "b"), ("user", "Hi"))
    assert long_a == long_b
    assert key(("system", "You are Ada."), ("user", "Hi"), max_bytes=0) is None


def test_system_messages_open_the_dialogue_as_the_character_block():
    character, dialogue, _ = chat_dialogue(
        messages(("system", "A"), ("developer", "B"), ("user", "Hi"), ("system", "later"))
    )
    assert character.definition == "A\n\nB"
    assert [m.role for m in dialogue.messages] == [chat_pb2.ROLE_USER, chat_pb2.ROLE_SYSTEM]
