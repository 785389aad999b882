"""The request body of `POST /v1/responses` (OpenAI's Responses API) as a pydantic model, and the fields
salon refuses.

`input` is kept as given and checked item by item in responses.py, so that a refusal names the item
(`input[2].content[0].type`). Unknown fields are refused like everywhere on this front; fields that
OpenAI defines and salon cannot honour are declared only to be refused with the reason
(`refuse_unsupported`). Accepted and echoed without effect on generation: `metadata`, `user`,
`safety_identifier`, `parallel_tool_calls`, `prompt_cache_key` (salon caches every prompt prefix by
itself, per tenant).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from salon.gateway.http.errors import invalid, unsupported

MAX_ID_CHARS = 256
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResponseStreamOptions(_Body):
    include_obfuscation: bool | None = None  # salon sends no obfuscation padding


class ResponsesRequest(_Body):
    model: str | None = None
    input: Any
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1, max_length=MAX_ID_CHARS)
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    stream_options: ResponseStreamOptions | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = Field(None, max_length=MAX_ID_CHARS)
    safety_identifier: str | None = Field(None, max_length=MAX_ID_CHARS)
    prompt_cache_key: str | None = Field(None, max_length=MAX_ID_CHARS)
    parallel_tool_calls: bool | None = None
    truncation: str | None = None
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    service_tier: str | None = None
    # Refused when set (see refuse_unsupported).
    reasoning: dict[str, Any] | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None


# Refused whenever present and not null.
_UNSUPPORTED = {
    "conversation": "conversation objects are not served; continue with previous_response_id",
    "prompt": "prompt templates are not served",
    "max_tool_calls": "tool calling is not supported",
}


def refuse_unsupported(body: ResponsesRequest) -> None:
    """400 naming the first field the request sets that salon cannot honour."""
    for field, why in _UNSUPPORTED.items():
        if getattr(body, field) is not None:
            raise unsupported(field, why)
    if body.tools:
        raise unsupported("tools", "tool calling is not supported")
    if body.tool_choice not in (None, "none", "auto"):
        raise unsupported("tool_choice", "tool calling is not supported")
    if body.reasoning and any(v is not None for v in body.reasoning.values()):
        raise unsupported("reasoning", "reasoning models are not served")
    if body.background:
        raise unsupported("background", "background responses are not supported")
    if body.top_logprobs:
        raise unsupported("top_logprobs", "log-probabilities are not offered on /v1/responses")
    if body.truncation not in (None, "disabled"):
        raise unsupported("truncation", "only 'disabled': a dialogue past the model's context is refused")
    fmt = (body.text or {}).get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema")):
        raise unsupported("text.format", "only the types 'text', 'json_object' and 'json_schema'")
    for k, item in enumerate(body.include or ()):
        # No reasoning items are ever produced, so there is nothing to include for them.
        if item != "reasoning.encrypted_content":
            raise unsupported(f"include[{k}]", f"{item!r} is not offered")
    if body.service_tier not in (None, "auto", "default"):
        raise unsupported("service_tier", f"{body.service_tier!r} is not offered")
    _check_metadata(body.metadata)


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid("metadata", f"at most {MAX_METADATA_PAIRS} pairs")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise invalid("metadata", f"keys are at most {MAX_METADATA_KEY_CHARS} characters")
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise invalid(f"metadata.{key}", f"at most {MAX_METADATA_VALUE_CHARS} characters")
