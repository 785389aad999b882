"""Checks made at the edge, before routing. The engine validates everything about the model
(token ids, sampling values, context length); the gateway checks what it needs to route and account."""

from __future__ import annotations

from salon.api.chat.v1 import chat_pb2
from salon.common.errors import InvalidArgument

MAX_CONVERSATION_ID_BYTES = 256
MAX_REQUEST_ID_BYTES = 128


def validate_conversation_id(conversation_id: str) -> None:
    num_bytes = len(conversation_id.encode("utf-8"))
    if num_bytes == 0:
        raise InvalidArgument("conversation_id: required (1..256 bytes)")
    if num_bytes > MAX_CONVERSATION_ID_BYTES:
        raise InvalidArgument(f"conversation_id: {num_bytes} bytes, at most {MAX_CONVERSATION_ID_BYTES} allowed")


def validate_generate(request: chat_pb2.GenerateRequest) -> None:
    """Raise InvalidArgument naming the first offending field."""
    validate_conversation_id(request.conversation_id)
    if len(request.request_id.encode("utf-8")) > MAX_REQUEST_ID_BYTES:
        raise InvalidArgument(f"request_id: at most {MAX_REQUEST_ID_BYTES} bytes")
    if not request.request_id.isprintable():
        raise InvalidArgument("request_id: must contain printable characters only")
    which = request.WhichOneof("context")
    if which is None:
        raise InvalidArgument("context: one of dialogue, tokens or text is required")
    if which == "dialogue" and not request.dialogue.messages:
        raise InvalidArgument("dialogue.messages: at least one message is required")
    if which == "text" and not request.text:
        raise InvalidArgument("text: at least one character is required")
    if which == "tokens" and not request.tokens.token_ids:
        raise InvalidArgument("tokens.token_ids: at least one token id is required")
