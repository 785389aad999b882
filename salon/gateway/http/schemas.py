"""Request bodies of the OpenAI-compatible API as pydantic models (the response bodies are built as
plain dicts in convert.py: they carry no validation).

Every model refuses fields it does not declare, and fields declared only to be refused (tools,
audio, ...) are listed in UNSUPPORTED with the reason: a client always
learns that its request asked for something salon does not do, never gets a reply that ignored it.
vLLM's extensions are accepted where salon implements them: top_k, min_p, repetition_penalty,
stop_token_ids, add_special_tokens, structured_outputs and the older guided_* fields (structured.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 8
MAX_STOP = 16


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    content: str | list[ContentPart] | None = None
    name: str | None = None


class SamplingFields(_Body):
    """The sampling fields both completion endpoints share (OpenAI's, then vLLM's extensions)."""

    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=100)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    user: str | None = Field(None, max_length=256)
    # vLLM's extension: each choice of each chunk (or the whole choice) also carries its token ids.
    return_token_ids: bool = False
    # Structured output (structured.py): vLLM's structured_outputs and its older guided_* fields.
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None  # a schema (object or JSON text), checked in structured.py
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # Refused (see UNSUPPORTED); declared so the refusal can say why.
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None
    ignore_eos: bool | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    # Refused (see UNSUPPORTED).
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    store: bool | None = None
    metadata: Any = None
    service_tier: str | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = None
    suffix: str | None = None
    response_format: dict[str, Any] | None = None


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


# field -> why it is refused, checked when the field is present and not null (convert.py).
UNSUPPORTED: dict[str, str] = {
    "tools": "tool calling is not supported",
    "tool_choice": "tool calling is not supported",
    "functions": "function calling is not supported",
    "function_call": "function calling is not supported",
    "parallel_tool_calls": "tool calling is not supported",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "reasoning_effort": "reasoning models are not served",
    "metadata": "stored completions are not supported",
    "logit_bias": "logit_bias is not supported",
    "ignore_eos": "ignore_eos is not supported",
    "echo": "echo is not supported",
    "suffix": "suffix (insertion) is not supported",
}

Role = Literal["system", "developer", "user", "assistant"]
