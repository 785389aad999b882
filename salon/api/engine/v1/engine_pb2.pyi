from salon.api.chat.v1 import chat_pb2 as _chat_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "conversation_id", "namespace_salt", "character", "dialogue", "tokens", "text", "sampling", "resume_token_ids", "prefill_from_request_id", "namespace_grant", "priority", "cache_salt", "chat_template_kwargs_json", "tools", "tool_choice", "parallel_tool_calls")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_SALT_FIELD_NUMBER: _ClassVar[int]
    CHARACTER_FIELD_NUMBER: _ClassVar[int]
    DIALOGUE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FROM_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_GRANT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    conversation_id: str
    namespace_salt: str
    character: _chat_pb2.Character
    dialogue: _chat_pb2.Dialogue
    tokens: _chat_pb2.TokenizedPrompt
    text: str
    sampling: _chat_pb2.SamplingParams
    resume_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prefill_from_request_id: str
    namespace_grant: bytes
    priority: int
    cache_salt: str
    chat_template_kwargs_json: str
    tools: _containers.RepeatedCompositeFieldContainer[_chat_pb2.Tool]
    tool_choice: _chat_pb2.ToolChoice
    parallel_tool_calls: bool
    def __init__(self, request_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., namespace_salt: _Optional[str] = ..., character: _Optional[_Union[_chat_pb2.Character, _Mapping]] = ..., dialogue: _Optional[_Union[_chat_pb2.Dialogue, _Mapping]] = ..., tokens: _Optional[_Union[_chat_pb2.TokenizedPrompt, _Mapping]] = ..., text: _Optional[str] = ..., sampling: _Optional[_Union[_chat_pb2.SamplingParams, _Mapping]] = ..., resume_token_ids: _Optional[_Iterable[int]] = ..., prefill_from_request_id: _Optional[str] = ..., namespace_grant: _Optional[bytes] = ..., priority: _Optional[int] = ..., cache_salt: _Optional[str] = ..., chat_template_kwargs_json: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[_chat_pb2.Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[_chat_pb2.ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("namespace_salt", "character", "text", "dialogue", "add_special_tokens")
    NAMESPACE_SALT_FIELD_NUMBER: _ClassVar[int]
    CHARACTER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DIALOGUE_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    namespace_salt: str
    character: _chat_pb2.Character
    text: str
    dialogue: _chat_pb2.Dialogue
    add_special_tokens: bool
    def __init__(self, namespace_salt: _Optional[str] = ..., character: _Optional[_Union[_chat_pb2.Character, _Mapping]] = ..., text: _Optional[str] = ..., dialogue: _Optional[_Union[_chat_pb2.Dialogue, _Mapping]] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "max_context_tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_context_tokens: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., max_context_tokens: _Optional[int] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("delta", "final")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    delta: _chat_pb2.TokenDelta
    final: _chat_pb2.GenerateFinal
    def __init__(self, delta: _Optional[_Union[_chat_pb2.TokenDelta, _Mapping]] = ..., final: _Optional[_Union[_chat_pb2.GenerateFinal, _Mapping]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: bool
    def __init__(self, aborted: _Optional[bool] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLoadResponse(_message.Message):
    __slots__ = ("load",)
    LOAD_FIELD_NUMBER: _ClassVar[int]
    load: LoadReport
    def __init__(self, load: _Optional[_Union[LoadReport, _Mapping]] = ...) -> None: ...

class WatchLoadResponse(_message.Message):
    __slots__ = ("load",)
    LOAD_FIELD_NUMBER: _ClassVar[int]
    load: LoadReport
    def __init__(self, load: _Optional[_Union[LoadReport, _Mapping]] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: _chat_pb2.ModelInfo
    def __init__(self, model: _Optional[_Union[_chat_pb2.ModelInfo, _Mapping]] = ...) -> None: ...

class DeleteConversationRequest(_message.Message):
    __slots__ = ("conversation_id", "namespace_salt", "namespace_grant")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_SALT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_GRANT_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    namespace_salt: str
    namespace_grant: bytes
    def __init__(self, conversation_id: _Optional[str] = ..., namespace_salt: _Optional[str] = ..., namespace_grant: _Optional[bytes] = ...) -> None: ...

class DeleteConversationResponse(_message.Message):
    __slots__ = ("aborted_requests", "device_blocks_dropped", "host_blocks_dropped")
    ABORTED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BLOCKS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    HOST_BLOCKS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    aborted_requests: int
    device_blocks_dropped: int
    host_blocks_dropped: int
    def __init__(self, aborted_requests: _Optional[int] = ..., device_blocks_dropped: _Optional[int] = ..., host_blocks_dropped: _Optional[int] = ...) -> None: ...

class WatchLoadRequest(_message.Message):
    __slots__ = ("interval_ms",)
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    def __init__(self, interval_ms: _Optional[int] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("engine_id", "running_requests", "waiting_requests", "max_waiting_requests", "free_kv_blocks", "total_kv_blocks", "decode_tokens_per_s", "draining", "cached_kv_blocks", "model_id", "resident")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FREE_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    CACHED_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    running_requests: int
    waiting_requests: int
    max_waiting_requests: int
    free_kv_blocks: int
    total_kv_blocks: int
    decode_tokens_per_s: float
    draining: bool
    cached_kv_blocks: int
    model_id: str
    resident: _chat_pb2.ResidentBytes
    def __init__(self, engine_id: _Optional[str] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., max_waiting_requests: _Optional[int] = ..., free_kv_blocks: _Optional[int] = ..., total_kv_blocks: _Optional[int] = ..., decode_tokens_per_s: _Optional[float] = ..., draining: _Optional[bool] = ..., cached_kv_blocks: _Optional[int] = ..., model_id: _Optional[str] = ..., resident: _Optional[_Union[_chat_pb2.ResidentBytes, _Mapping]] = ...) -> None: ...
