"""The gateway parses engine Generate events directly as salon.chat.v1.GenerateResponse: the two
message types must stay wire-identical."""

from __future__ import annotations

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2


def fields(descriptor):
    return sorted(
        (
            f.number,
            f.name,
            f.type,
            f.message_type.full_name if f.message_type else None,
            f.containing_oneof.name if f.containing_oneof else None,
        )
        for f in descriptor.fields
    )


def test_engine_and_chat_generate_response_are_wire_identical() -> None:
    assert fields(engine_pb2.GenerateResponse.DESCRIPTOR) == fields(chat_pb2.GenerateResponse.DESCRIPTOR)


def test_round_trip_through_bytes() -> None:
    event = engine_pb2.GenerateResponse(delta=chat_pb2.TokenDelta(text="hé", token_ids=[1, 2, 70000], logprobs=[-0.5]))
    assert chat_pb2.GenerateResponse.FromString(event.SerializeToString()).delta == event.delta
    final = engine_pb2.GenerateResponse(final=chat_pb2.GenerateFinal(engine_id="e1", failovers=0))
    assert chat_pb2.GenerateResponse.FromString(final.SerializeToString()).final == final.final
