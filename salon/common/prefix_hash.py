"""The chained block hash: the one definition of a prefix's identity, shared by engine, kvstore and gateway.

A context is cut into whole blocks of `block_size` tokens (a partial tail block has no hash). Block i's
hash covers the namespace, the hash of block i-1 and the block's own token ids, so equal hashes mean
equal prefixes (up to a BLAKE2b collision) and a prefix of a context has a prefix of its hashes:

    namespace ──┐
                ├─ H ─▶ h0 ──┐
    ids[0:16] ──┘            ├─ H ─▶ h1 ──┐
                ids[16:32] ──┘            ├─ H ─▶ h2 ...
                             ids[32:48] ──┘

    H(namespace, parent, ids) = BLAKE2b-256( len(namespace) as uint32 LE ‖ namespace ‖ parent ‖ ids as uint32 LE )
    parent of block 0 = 32 zero bytes

The namespace folds in the model, the KV layout and the tenant's salt, so tenants never share
entries. Python's `hash()` is never used: it is neither collision resistant nor stable across
processes. Consumers that index by these hashes still verify hits against stored token ids.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence
from typing import NewType

# A block's chained hash: 32 bytes of BLAKE2b.
BlockHash = NewType("BlockHash", bytes)

HASH_BYTES = 32
TOKEN_ID_BYTES = 4
ROOT_PARENT = BlockHash(bytes(HASH_BYTES))
_NAMESPACE_PERSON = b"salon-namespace"
_CACHE_SALT_PERSON = b"salon-cache-salt"

if array("I").itemsize != TOKEN_ID_BYTES:  # pragma: no cover - every supported platform has 4-byte 'I'
    raise ImportError("array('I') is not 4 bytes wide on this platform")


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    """The canonical encoding of token ids: each as a little-endian uint32 (4 bytes).

    Raises OverflowError for an id outside [0, 2**32).
    """
    if isinstance(token_ids, (bytes, bytearray, memoryview)):
        raise TypeError("token_ids must be a sequence of ints, not bytes")
    packed = array("I", token_ids)
    if sys.byteorder != "little":  # pragma: no cover
        packed.byteswap()
    return packed.tobytes()


def decode_token_ids(data: bytes) -> list[int]:
    """Inverse of encode_token_ids. Raises ValueError if len(data) is not a multiple of 4."""
    if len(data) % TOKEN_ID_BYTES:
        raise ValueError(f"token id bytes must be a multiple of {TOKEN_ID_BYTES}, got {len(data)}")
    packed = array("I")
    packed.frombytes(data)
    if sys.byteorder != "little":  # pragma: no cover
        packed.byteswap()
    return packed.tolist()


def namespace_digest(model_id: str, kv_layout: str, tenant_salt: str) -> bytes:
    """32-byte digest naming what may share cache entries: one model, one KV layout, one tenant.

    Each field is length-prefixed, so ("ab", "c", ...) and ("a", "bc", ...) differ.
    """
    h = hashlib.blake2b(digest_size=HASH_BYTES, person=_NAMESPACE_PERSON)
    for field in (model_id, kv_layout, tenant_salt):
        encoded = field.encode("utf-8")
        h.update(len(encoded).to_bytes(4, "little"))
        h.update(encoded)
    return h.digest()


def salted_namespace_salt(tenant_salt: str, cache_salt: str) -> str:
    """The namespace salt of a request with a cache_salt (vLLM's): a sub-namespace of the tenant's, so requests
    share entries only with the same tenant salt and the same cache_salt; the tenant salt itself without one.

    The cache_salt enters as its BLAKE2b digest after a separator a tenant salt never holds (gateway salts are
    configured strings or hex HMACs), so no (tenant, cache_salt) pair names another tenant's namespace."""
    if not cache_salt:
        return tenant_salt
    digest = hashlib.blake2b(cache_salt.encode("utf-8"), digest_size=16, person=_CACHE_SALT_PERSON).hexdigest()
    return f"{tenant_salt}\x00cache_salt\x00{digest}"


def chain_hash(namespace: bytes, parent: BlockHash, block_token_bytes: bytes) -> BlockHash:
    """H(namespace, parent, block ids) for one block whose ids are already canonically encoded."""
    h = hashlib.blake2b(digest_size=HASH_BYTES)
    h.update(len(namespace).to_bytes(4, "little"))
    h.update(namespace)
    h.update(parent)
    h.update(block_token_bytes)
    return BlockHash(h.digest())


def block_hashes(
    namespace: bytes, token_ids: Sequence[int], block_size: int, parent: BlockHash = ROOT_PARENT
) -> list[BlockHash]:
    """Chained hashes of the whole blocks of token_ids (len(token_ids) // block_size of them); with `parent`,
    token_ids continue a context whose last whole block hashed to it."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    num_blocks = len(token_ids) // block_size
    encoded = encode_token_ids(token_ids[: num_blocks * block_size])
    block_bytes = block_size * TOKEN_ID_BYTES
    hashes: list[BlockHash] = []
    for i in range(num_blocks):
        parent = chain_hash(namespace, parent, encoded[i * block_bytes : (i + 1) * block_bytes])
        hashes.append(parent)
    return hashes
