"""The chained block hash: exact digests, the prefix property, namespace separation."""

from __future__ import annotations

import hashlib
import random
import struct

import pytest

from salon.common.prefix_hash import (
    block_hashes,
    decode_token_ids,
    encode_token_ids,
    namespace_digest,
)

NS = namespace_digest("gemma-3-270m", "int8-b16", "tenant-a")


def reference_hashes(namespace: bytes, ids: list[int], block_size: int) -> list[bytes]:
    """The documented formula, written out independently of the module."""
    out, parent = [], bytes(32)
    for i in range(len(ids) // block_size):
        block = struct.pack(f"<{block_size}I", *ids[i * block_size : (i + 1) * block_size])
        parent = hashlib.blake2b(
            struct.pack("<I", len(namespace)) + namespace + parent + block, digest_size=32
        ).digest()
        out.append(parent)
    return out


def test_known_digests() -> None:
    assert NS.hex() == "779268be91cf971051f1519826da2d2b2b43991442a778446154a76d43737e30"
    hashes = block_hashes(NS, [1, 2, 3, 4, 5, 6, 7, 8, 9], block_size=4)
    assert [h.hex() for h in hashes] == [
        "9f1185ada530619cc343f1f72c42e5ac58055b99f90f4d67cb0ccbfdcacd44a5",
        "345e5859746527b8ff1d6d8cc5695811dd6384b23744ba8cd448e855d50372da",
    ]


def test_matches_reference_formula() -> None:
    rng = random.Random(7)
    for block_size in (1, 3, 16):
        ids = [rng.randrange(2**32) for _ in range(rng.randrange(0, 100))]
        assert block_hashes(NS, ids, block_size) == reference_hashes(NS, ids, block_size)


def test_whole_blocks_only() -> None:
    assert block_hashes(NS, list(range(15)), 16) == []
    assert len(block_hashes(NS, list(range(47)), 16)) == 2


def test_prefix_property_and_divergence() -> None:
    rng = random.Random(1)
    ids = [rng.randrange(262144) for _ in range(160)]
    full = block_hashes(NS, ids, 16)
    assert block_hashes(NS, ids[:80], 16) == full[:5]
    edited = list(ids)
    edited[70] += 1  # inside block 4
    changed = block_hashes(NS, edited, 16)
    assert changed[:4] == full[:4]
    assert all(a != b for a, b in zip(changed[4:], full[4:]))  # every later block differs too


def test_namespace_changes_every_hash() -> None:
    ids = list(range(64))
    others = [
        namespace_digest("gemma-3-270m", "int8-b16", "tenant-b"),
        namespace_digest("gemma-3-270m", "int8-b32", "tenant-a"),
        namespace_digest("other", "int8-b16", "tenant-a"),
        namespace_digest("gemma-3-270mint8-b16", "", "tenant-a"),  # length prefixes keep fields apart
    ]
    base = block_hashes(NS, ids, 16)
    for ns in others:
        assert ns != NS
        assert not set(block_hashes(ns, ids, 16)) & set(base)


def test_encoding_is_canonical_little_endian() -> None:
    assert encode_token_ids([1, 0x01020304]) == b"\x01\x00\x00\x00\x04\x03\x02\x01"
    assert decode_token_ids(encode_token_ids([5, 2**32 - 1])) == [5, 2**32 - 1]
    with pytest.raises(OverflowError):
        encode_token_ids([-1])
    with pytest.raises(OverflowError):
        encode_token_ids([2**32])
    with pytest.raises(ValueError):
        decode_token_ids(b"\x00\x00\x00")
    with pytest.raises(ValueError):
        block_hashes(NS, [1, 2], 0)


def test_a_context_continued_from_its_last_hash_hashes_like_the_whole() -> None:
    ids = list(range(100, 180))
    whole = block_hashes(NS, ids, 16)
    head = block_hashes(NS, ids[:32], 16)
    assert head + block_hashes(NS, ids[32:], 16, parent=head[-1]) == whole
