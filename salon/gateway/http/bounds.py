"""A parsed body against the served model's context and vocabulary, before it is converted.

Every message renders to at least one token and every id is one token (salon/common/prompt_bounds.py),
so a body whose counts already fill the context is refused here (400 naming the field) without
walking its messages; and a reply budget over the context can never be met. The engine checks the
exact figures again once the prompt is rendered. A token id the vocabulary does not hold is refused
here too, named as the request names it (the engine would name its own field, tokens.token_ids[i]).
"""

from __future__ import annotations

from salon.api.chat.v1 import chat_pb2
from salon.gateway.http.errors import invalid
from salon.gateway.http.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest


def check_fits(body, info: chat_pb2.ModelInfo) -> None:
    """400 naming the first count of `body` that cannot fit the context of `info` (if it reports one)."""
    context, vocab = info.max_context_tokens, info.vocab_size
    if not context:
        return
    if isinstance(body, (ChatCompletionRequest, TokenizeRequest)) and body.messages is not None:
        if len(body.messages) >= context:
            raise invalid("messages", f"{len(body.messages)} messages cannot fit in the context of {context} tokens")
    if isinstance(body, CompletionRequest) and isinstance(body.prompt, list) and body.prompt:
        nested = isinstance(body.prompt[0], list)
        for i, ids in enumerate(body.prompt if nested else [body.prompt]):
            if ids and not isinstance(ids[0], str):
                if len(ids) >= context:
                    raise invalid(
                        f"prompt[{i}]" if nested else "prompt",
                        f"{len(ids)} token ids leave no room to generate in the context of {context} tokens",
                    )
                _check_ids(ids, f"prompt.{i}" if nested else "prompt", vocab)
    if isinstance(body, DetokenizeRequest):
        if len(body.tokens) > context:
            raise invalid("tokens", f"{len(body.tokens)} token ids are more than the context of {context} tokens")
        _check_ids(body.tokens, "tokens", vocab)
    for key in getattr(body, "logit_bias", None) or {}:  # keys that are not ids: convert.logit_bias names them
        if vocab and key.isascii() and key.isdigit() and (len(key.lstrip("0")) > len(str(vocab)) or int(key) >= vocab):
            raise invalid(f"logit_bias.{key}", f"token id {key} is not below the vocabulary size {vocab}")
    for field in ("max_tokens", "max_completion_tokens"):
        value = getattr(body, field, None)
        if value is not None and value >= context:
            raise invalid(field, f"{value} leaves no room for a prompt in the context of {context} tokens")


def _check_ids(ids: list[int], field: str, vocab_size: int) -> None:
    """400 naming the first id of `ids` (bounded by the context) that is not below `vocab_size` (if reported)."""
    if vocab_size and ids and max(ids) >= vocab_size:
        j = next(j for j, t in enumerate(ids) if t >= vocab_size)
        raise invalid(f"{field}.{j}", f"token id {ids[j]} is not below the vocabulary size {vocab_size}")
