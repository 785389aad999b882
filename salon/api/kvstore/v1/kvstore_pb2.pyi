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

class NamespaceClaim(_message.Message):
    __slots__ = ("tenant_salt", "model_id", "layout_tag", "grant")
    TENANT_SALT_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_TAG_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    tenant_salt: str
    model_id: str
    layout_tag: str
    grant: bytes
    def __init__(self, tenant_salt: _Optional[str] = ..., model_id: _Optional[str] = ..., layout_tag: _Optional[str] = ..., grant: _Optional[bytes] = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("namespace", "token_ids_le32", "layout")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_LE32_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    token_ids_le32: bytes
    layout: KVLayout
    def __init__(self, namespace: _Optional[bytes] = ..., token_ids_le32: _Optional[bytes] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ...) -> None: ...

class MatchResponse(_message.Message):
    __slots__ = ("matched_tokens", "usable_tokens")
    MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    matched_tokens: int
    usable_tokens: int
    def __init__(self, matched_tokens: _Optional[int] = ..., usable_tokens: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("namespace", "token_ids_le32", "max_tokens", "layout", "transport", "from_block_index")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_LE32_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    FROM_BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    token_ids_le32: bytes
    max_tokens: int
    layout: KVLayout
    transport: Transport
    from_block_index: int
    def __init__(self, namespace: _Optional[bytes] = ..., token_ids_le32: _Optional[bytes] = ..., max_tokens: _Optional[int] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., transport: _Optional[_Union[Transport, str]] = ..., from_block_index: _Optional[int] = ...) -> None: ...

class FetchHeader(_message.Message):
    __slots__ = ("num_tokens", "local_from_block_index", "shm_name", "lease_id", "lease_ttl_ms", "global_offsets", "local_offsets")
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FROM_BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    num_tokens: int
    local_from_block_index: int
    shm_name: str
    lease_id: str
    lease_ttl_ms: int
    global_offsets: _containers.RepeatedScalarFieldContainer[int]
    local_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, num_tokens: _Optional[int] = ..., local_from_block_index: _Optional[int] = ..., shm_name: _Optional[str] = ..., lease_id: _Optional[str] = ..., lease_ttl_ms: _Optional[int] = ..., global_offsets: _Optional[_Iterable[int]] = ..., local_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class KVChunk(_message.Message):
    __slots__ = ("first_global_block_index", "global_kv", "first_local_block_index", "local_kv")
    FIRST_GLOBAL_BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_KV_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOCAL_BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    LOCAL_KV_FIELD_NUMBER: _ClassVar[int]
    first_global_block_index: int
    global_kv: bytes
    first_local_block_index: int
    local_kv: bytes
    def __init__(self, first_global_block_index: _Optional[int] = ..., global_kv: _Optional[bytes] = ..., first_local_block_index: _Optional[int] = ..., local_kv: _Optional[bytes] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: FetchHeader
    chunk: KVChunk
    def __init__(self, header: _Optional[_Union[FetchHeader, _Mapping]] = ..., chunk: _Optional[_Union[KVChunk, _Mapping]] = ...) -> None: ...

class PutHeader(_message.Message):
    __slots__ = ("namespace", "token_ids_le32", "layout", "conversation_id", "claim")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_LE32_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    token_ids_le32: bytes
    layout: KVLayout
    conversation_id: str
    claim: NamespaceClaim
    def __init__(self, namespace: _Optional[bytes] = ..., token_ids_le32: _Optional[bytes] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., conversation_id: _Optional[str] = ..., claim: _Optional[_Union[NamespaceClaim, _Mapping]] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: PutHeader
    chunk: KVChunk
    def __init__(self, header: _Optional[_Union[PutHeader, _Mapping]] = ..., chunk: _Optional[_Union[KVChunk, _Mapping]] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("counts",)
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    counts: PutCounts
    def __init__(self, counts: _Optional[_Union[PutCounts, _Mapping]] = ...) -> None: ...

class CommitSharedPutResponse(_message.Message):
    __slots__ = ("counts",)
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    counts: PutCounts
    def __init__(self, counts: _Optional[_Union[PutCounts, _Mapping]] = ...) -> None: ...

class PutCounts(_message.Message):
    __slots__ = ("stored_blocks", "existing_blocks", "evicted_blocks", "skipped_blocks")
    STORED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EXISTING_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    stored_blocks: int
    existing_blocks: int
    evicted_blocks: int
    skipped_blocks: int
    def __init__(self, stored_blocks: _Optional[int] = ..., existing_blocks: _Optional[int] = ..., evicted_blocks: _Optional[int] = ..., skipped_blocks: _Optional[int] = ...) -> None: ...

class PrepareSharedPutRequest(_message.Message):
    __slots__ = ("header", "num_blocks", "local_block_indices", "first_block_index", "writer_id", "writes_done_below_generation")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BLOCK_INDICES_FIELD_NUMBER: _ClassVar[int]
    FIRST_BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    WRITER_ID_FIELD_NUMBER: _ClassVar[int]
    WRITES_DONE_BELOW_GENERATION_FIELD_NUMBER: _ClassVar[int]
    header: PutHeader
    num_blocks: int
    local_block_indices: _containers.RepeatedScalarFieldContainer[int]
    first_block_index: int
    writer_id: int
    writes_done_below_generation: int
    def __init__(self, header: _Optional[_Union[PutHeader, _Mapping]] = ..., num_blocks: _Optional[int] = ..., local_block_indices: _Optional[_Iterable[int]] = ..., first_block_index: _Optional[int] = ..., writer_id: _Optional[int] = ..., writes_done_below_generation: _Optional[int] = ...) -> None: ...

class SharedPutSlot(_message.Message):
    __slots__ = ("block_index", "write_global", "global_offset", "write_local", "local_offset")
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    WRITE_GLOBAL_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WRITE_LOCAL_FIELD_NUMBER: _ClassVar[int]
    LOCAL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    block_index: int
    write_global: bool
    global_offset: int
    write_local: bool
    local_offset: int
    def __init__(self, block_index: _Optional[int] = ..., write_global: _Optional[bool] = ..., global_offset: _Optional[int] = ..., write_local: _Optional[bool] = ..., local_offset: _Optional[int] = ...) -> None: ...

class PrepareSharedPutResponse(_message.Message):
    __slots__ = ("lease_id", "shm_name", "slots", "existing_blocks", "lease_ttl_ms", "generation")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    EXISTING_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    shm_name: str
    slots: _containers.RepeatedCompositeFieldContainer[SharedPutSlot]
    existing_blocks: int
    lease_ttl_ms: int
    generation: int
    def __init__(self, lease_id: _Optional[str] = ..., shm_name: _Optional[str] = ..., slots: _Optional[_Iterable[_Union[SharedPutSlot, _Mapping]]] = ..., existing_blocks: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class CommitSharedPutRequest(_message.Message):
    __slots__ = ("lease_id", "global_crc32", "local_crc32")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_CRC32_FIELD_NUMBER: _ClassVar[int]
    LOCAL_CRC32_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    global_crc32: _containers.RepeatedScalarFieldContainer[int]
    local_crc32: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, lease_id: _Optional[str] = ..., global_crc32: _Optional[_Iterable[int]] = ..., local_crc32: _Optional[_Iterable[int]] = ...) -> None: ...

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
    __slots__ = ("used_bytes", "capacity_bytes", "num_blocks", "query_tokens", "hit_tokens", "evicted_blocks", "started_at_unix_ms", "num_local_blocks", "evicted_local_blocks", "matched_tokens", "num_leases", "num_namespaces", "shm_name", "quarantined_bytes")
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    QUERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_LOCAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_LOCAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_LEASES_FIELD_NUMBER: _ClassVar[int]
    NUM_NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_BYTES_FIELD_NUMBER: _ClassVar[int]
    used_bytes: int
    capacity_bytes: int
    num_blocks: int
    query_tokens: int
    hit_tokens: int
    evicted_blocks: int
    started_at_unix_ms: int
    num_local_blocks: int
    evicted_local_blocks: int
    matched_tokens: int
    num_leases: int
    num_namespaces: int
    shm_name: str
    quarantined_bytes: int
    def __init__(self, used_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., num_blocks: _Optional[int] = ..., query_tokens: _Optional[int] = ..., hit_tokens: _Optional[int] = ..., evicted_blocks: _Optional[int] = ..., started_at_unix_ms: _Optional[int] = ..., num_local_blocks: _Optional[int] = ..., evicted_local_blocks: _Optional[int] = ..., matched_tokens: _Optional[int] = ..., num_leases: _Optional[int] = ..., num_namespaces: _Optional[int] = ..., shm_name: _Optional[str] = ..., quarantined_bytes: _Optional[int] = ...) -> None: ...

class DropRequest(_message.Message):
    __slots__ = ("namespace", "conversation_id", "claim")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    conversation_id: str
    claim: NamespaceClaim
    def __init__(self, namespace: _Optional[bytes] = ..., conversation_id: _Optional[str] = ..., claim: _Optional[_Union[NamespaceClaim, _Mapping]] = ...) -> None: ...

class DropResponse(_message.Message):
    __slots__ = ("dropped_blocks",)
    DROPPED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    dropped_blocks: int
    def __init__(self, dropped_blocks: _Optional[int] = ...) -> None: ...
