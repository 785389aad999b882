"""The kvstore's one configuration dataclass, built in __main__ from flags/env (SALON_KVSTORE_*)."""

from __future__ import annotations

from dataclasses import dataclass, field

from salon.common.server import ServerConfig


@dataclass(frozen=True)
class KVStoreConfig:
    """salon kvstore: host-memory cross-turn KV cache shared by the engines of one host."""

    server: ServerConfig = field(default_factory=ServerConfig)
    capacity_bytes: int = field(default=1 << 30, metadata={"help": "bytes of KV held (the arena's size)"})
    shm_dir: str = field(
        default="/dev/shm/salon-kvstore",
        metadata={"help": "tmpfs directory for the shared-memory arena: this user's, mode 0700 (created if missing)"},
    )
    lease_ttl_s: float = field(default=30.0, metadata={"help": "shared-memory leases end by themselves after this"})
    fetch_chunk_bytes: int = field(default=4 << 20, metadata={"help": "KV bytes per gRPC Fetch message (about)"})
    max_leases_per_peer: int = field(
        default=256, metadata={"help": "shared-memory leases one caller may hold (more: RESOURCE_EXHAUSTED)"}
    )
    namespace_grant_key_file: str | None = field(
        default=None,
        metadata={
            "help": "key shared with the gateways: Put, PrepareSharedPut and Drop need a "
            "gateway's namespace grant (unset: not checked)"
        },
    )
