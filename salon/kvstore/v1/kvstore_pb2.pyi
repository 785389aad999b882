from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Transport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSPORT_UNSPECIFIED: _ClassVar[Transport]
    TRANSPORT_GRPC: _ClassVar[Transport]
    TRANSPORT_SHARED_MEMORY: _ClassVar[Transport]
TRANSPORT_UNSPECIFIED: Transport
TRANSPORT_GRPC: Transport
TRANSPORT_SHARED_MEMORY: Transport

class KVLayout(_message.Message):
    __slots__ = ("block_size_tokens", "global_bytes_per_block", "local_bytes_per_block", "sliding_window_tokens")
    BLOCK_SIZE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    block_size_tokens: int
    global_bytes_per_block: int
    local_bytes_per_block: int
    sliding_window_tokens: int
    def __init__(self, block_size_tokens: _Optional[int] = ..., global_bytes_per_block: _Optional[int] = ..., local_bytes_per_block: _Optional[int] = ..., sliding_window_tokens: _Optional[int] = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("namespace", "token_ids", "layout")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    layout: KVLayout
    def __init__(self, namespace: _Optional[bytes] = ..., token_ids: _Optional[_Iterable[int]] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ...) -> None: ...

class MatchResponse(_message.Message):
    __slots__ = ("matched_tokens", "usable_tokens")
    MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    matched_tokens: int
    usable_tokens: int
    def __init__(self, matched_tokens: _Optional[int] = ..., usable_tokens: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("namespace", "token_ids", "num_tokens", "layout", "transport")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    layout: KVLayout
    transport: Transport
    def __init__(self, namespace: _Optional[bytes] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., transport: _Optional[_Union[Transport, str]] = ...) -> None: ...

class ShmSlice(_message.Message):
    __slots__ = ("offset", "length")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("block_index", "global_kv", "local_kv", "global_shm", "local_shm", "shm_name", "lease_id", "ok")
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_KV_FIELD_NUMBER: _ClassVar[int]
    LOCAL_KV_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_SHM_FIELD_NUMBER: _ClassVar[int]
    LOCAL_SHM_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    block_index: int
    global_kv: bytes
    local_kv: bytes
    global_shm: ShmSlice
    local_shm: ShmSlice
    shm_name: str
    lease_id: str
    ok: bool
    def __init__(self, block_index: _Optional[int] = ..., global_kv: _Optional[bytes] = ..., local_kv: _Optional[bytes] = ..., global_shm: _Optional[_Union[ShmSlice, _Mapping]] = ..., local_shm: _Optional[_Union[ShmSlice, _Mapping]] = ..., shm_name: _Optional[str] = ..., lease_id: _Optional[str] = ..., ok: _Optional[bool] = ...) -> None: ...

class PutHeader(_message.Message):
    __slots__ = ("namespace", "token_ids", "layout", "conversation_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    layout: KVLayout
    conversation_id: str
    def __init__(self, namespace: _Optional[bytes] = ..., token_ids: _Optional[_Iterable[int]] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., conversation_id: _Optional[str] = ...) -> None: ...

class PutBlock(_message.Message):
    __slots__ = ("block_index", "global_kv", "local_kv")
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_KV_FIELD_NUMBER: _ClassVar[int]
    LOCAL_KV_FIELD_NUMBER: _ClassVar[int]
    block_index: int
    global_kv: bytes
    local_kv: bytes
    def __init__(self, block_index: _Optional[int] = ..., global_kv: _Optional[bytes] = ..., local_kv: _Optional[bytes] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("header", "block")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    header: PutHeader
    block: PutBlock
    def __init__(self, header: _Optional[_Union[PutHeader, _Mapping]] = ..., block: _Optional[_Union[PutBlock, _Mapping]] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("stored_blocks", "existing_blocks", "evicted_blocks")
    STORED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EXISTING_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    stored_blocks: int
    existing_blocks: int
    evicted_blocks: int
    def __init__(self, stored_blocks: _Optional[int] = ..., existing_blocks: _Optional[int] = ..., evicted_blocks: _Optional[int] = ...) -> None: ...

class ReleaseLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ReleaseLeaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("used_bytes", "capacity_bytes", "num_blocks", "query_tokens", "hit_tokens", "evicted_blocks", "started_at_unix_ms")
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    QUERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    used_bytes: int
    capacity_bytes: int
    num_blocks: int
    query_tokens: int
    hit_tokens: int
    evicted_blocks: int
    started_at_unix_ms: int
    def __init__(self, used_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., num_blocks: _Optional[int] = ..., query_tokens: _Optional[int] = ..., hit_tokens: _Optional[int] = ..., evicted_blocks: _Optional[int] = ..., started_at_unix_ms: _Optional[int] = ...) -> None: ...

class DropRequest(_message.Message):
    __slots__ = ("namespace", "conversation_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    conversation_id: str
    def __init__(self, namespace: _Optional[bytes] = ..., conversation_id: _Optional[str] = ...) -> None: ...

class DropResponse(_message.Message):
    __slots__ = ("dropped_blocks",)
    DROPPED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    dropped_blocks: int
    def __init__(self, dropped_blocks: _Optional[int] = ...) -> None: ...
