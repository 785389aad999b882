"""A parsed body against the served model's context, from counts alone, before it is converted.

Every message renders to at least one token and every id is one token (salon/common/prompt_bounds.py),
so a body whose counts already fill the context is refused here (400 naming the field) without
walking its messages; and a reply budget over the context can never be met. The engine checks the
exact figures again once the prompt is rendered.
"""

from __future__ import annotations

from salon.api.chat.v1 import chat_pb2
from salon.gateway.http.errors import invalid
from salon.gateway.http.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest


def check_fits(body, info: chat_pb2.ModelInfo) -> None:
    """400 naming the first count of `body` that cannot fit the context of `info` (if it reports one)."""
    context = info.max_context_tokens
    if not context:
        return
    if isinstance(body, (ChatCompletionRequest, TokenizeRequest)) and body.messages is not None:
        if len(body.messages) >= context:
            raise invalid("messages", f"{len(body.messages)} messages cannot fit in the context of {context} tokens")
    if isinstance(body, CompletionRequest) and isinstance(body.prompt, list) and body.prompt:
        nested = isinstance(body.prompt[0], list)
        for i, ids in enumerate(body.prompt if nested else [body.prompt]):
            if ids and not isinstance(ids[0], str) and len(ids) >= context:
                raise invalid(
                    f"prompt[{i}]" if nested else "prompt",
                    f"{len(ids)} token ids leave no room to generate in the context of {context} tokens",
                )
    if isinstance(body, DetokenizeRequest) and len(body.tokens) > context:
        raise invalid("tokens", f"{len(body.tokens)} token ids are more than the context of {context} tokens")
    for field in ("max_tokens", "max_completion_tokens"):
        value = getattr(body, field, None)
        if value is not None and value >= context:
            raise invalid(field, f"{value} leaves no room for a prompt in the context of {context} tokens")
