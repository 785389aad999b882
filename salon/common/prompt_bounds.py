"""A bound on a request's prompt that costs nothing to compute, checked before any per-item work.

Every message renders to at least one token and every token id given is one token, so

    tokens context:    prompt tokens  = len(token_ids)
    dialogue context:  prompt tokens >= sum over messages of max(1, len(message.token_ids))

A request whose bound already leaves no room in the context is refused (OUT_OF_RANGE, "prompt: ...")
before its fields are looked at one by one: the count of messages is read first (one length, no
iteration), so 300,000 one-character messages cost the same as one. The gateway applies this with
the context its engines report and the engine again with its own; the engine then applies a tighter
bound of its tokenizer (salon/engine/api/validation.py) after checking each field.
"""

from __future__ import annotations


def prompt_count_problem(request, max_context_tokens: int) -> str | None:
    """Why `request` (a chat or engine GenerateRequest) cannot fit, from counts alone; None if it might."""
    which = request.WhichOneof("context")
    if which == "tokens":
        num_tokens = len(request.tokens.token_ids)
        what = f"{num_tokens} token ids"
    elif which == "dialogue":
        messages = request.dialogue.messages
        num_tokens = len(messages)
        if num_tokens < max_context_tokens:  # bounded: fewer messages than the context has tokens
            num_tokens = sum(max(1, len(m.token_ids)) for m in messages)
        what = f"{len(messages)} messages (at least {num_tokens} tokens)"
    else:
        return None
    if num_tokens >= max_context_tokens:
        return f"prompt: {what} leave no room to generate in the context of {max_context_tokens} tokens"
    return None
