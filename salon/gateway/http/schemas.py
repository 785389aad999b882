"""Request bodies of the OpenAI-compatible API as pydantic models (the response bodies are built as
plain dicts in convert.py: they carry no validation).

Fields a model does not declare are ignored, as vLLM ignores them. Fields salon knows but does not do (legacy
functions, audio, ...) are declared only to be refused, and listed in UNSUPPORTED with the reason: a client
that asks for one learns it, never gets a reply that ignored it. vLLM's extensions are accepted with vLLM's
meaning: top_k, min_p, repetition_penalty, stop_token_ids, add_special_tokens, ignore_eos, min_tokens,
priority, skip_special_tokens, spaces_between_special_tokens, include_stop_str_in_output,
truncate_prompt_tokens, cache_salt, chat_template_kwargs, echo, return_token_ids, and structured_outputs
with the older guided_* fields (structured.py).

Every integer and list is bounded here, so validation costs at most the body's size and every value
fits its protobuf field (uint32 counts, token ids below 2^31): a value out of range is a 400 naming
the field, never a 500 from the conversion. Bounds that depend on the model (the context, checked
from counts alone) are in bounds.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from salon.common.request_bounds import MAX_CACHE_SALT_BYTES, MAX_LOGIT_BIAS, MAX_PRIORITY

MAX_N = 8
MAX_STOP = 16
# A list of prompts in /v1/completions: at most this many, and n choices of each.
MAX_PROMPTS = 16
MAX_UINT32 = 2**32 - 1
# Token ids, of a prompt or to detokenize: every vocabulary is far below 2^31.
MAX_TOKEN_ID = 2**31 - 1
MAX_TOKEN_IDS = 1 << 17
MAX_MESSAGES = 1 << 14
MAX_CONTENT_PARTS = 256

TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
TokenIds = Annotated[list[TokenId], Field(max_length=MAX_TOKEN_IDS)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # refused field by field in convert.py, naming the message
    role: str
    content: str | Annotated[list[ContentPart], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    name: str | None = None


class SamplingFields(_Body):
    """The sampling fields both completion endpoints share (OpenAI's, then vLLM's extensions)."""

    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_UINT32)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=MAX_UINT32)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=100)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=64)] | None = None
    user: str | None = Field(None, max_length=256)  # accepted, used for nothing
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_LOGIT_BIAS)
    # vLLM's extensions.
    # Each choice of each chunk (or the whole choice) also carries its token ids.
    return_token_ids: bool = False
    # Structured output (structured.py): vLLM's structured_outputs and its older guided_* fields.
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None  # a schema (object or JSON text), checked in structured.py
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(None, ge=0)
    priority: int | None = Field(None, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT_BYTES)
    echo: bool | None = None
    # Refused (see UNSUPPORTED); declared so the refusal can say why.
    best_of: int | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_UINT32)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None  # accepted, stored nowhere
    # Checked in tool_request.py.
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # Refused (see UNSUPPORTED).
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    store: bool | None = None
    service_tier: str | None = None


class CompletionRequest(SamplingFields):
    # A list of prompts: one completion each (convert.completion_requests), at most MAX_PROMPTS.
    prompt: (
        str
        | TokenIds
        | Annotated[list[str], Field(max_length=MAX_PROMPTS)]
        | Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)]
    )
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
    response_format: dict[str, Any] | None = None


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(max_length=MAX_MESSAGES)] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: TokenIds


# field -> why it is refused, checked when the field is present and not null (convert.py).
UNSUPPORTED: dict[str, str] = {
    "functions": "the legacy function calling is not supported; use tools",
    "function_call": "the legacy function calling is not supported; use tools and tool_choice",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "reasoning_effort": "reasoning models are not served",
    "suffix": "suffix (insertion) is not supported",
}

Role = Literal["system", "developer", "user", "assistant"]
