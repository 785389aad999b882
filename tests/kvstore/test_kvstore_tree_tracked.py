"""What a stored block costs CPython's full collection, which walks every tracked object with the GIL held (the
kvstore's event loop stalls for it): the node itself and its parent's children dict, nothing more. Its payloads'
spans are tuples of ints and its owners a dict of strings, which the collector stops tracking."""

from __future__ import annotations

import gc
import struct

from salon.common.kvstore_contract.layout import KVLayout
from salon.kvstore.radix_tree import RadixTree

LAYOUT = KVLayout(16, 64, 64, 512)
BLOCKS = 2000


def _tracked() -> int:
    gc.collect()  # also untracks the tuples and dicts that hold only untracked objects
    return len(gc.get_objects())


def test_a_stored_block_is_at_most_two_tracked_objects():
    tree = RadixTree(capacity_bytes=4 * BLOCKS * 64)
    ns = tree.get_or_create_namespace(b"ns", LAYOUT)
    before = _tracked()
    for dialogue in range(BLOCKS // 100):
        parent = ns.root
        for block in range(100):
            key = struct.pack("<16I", dialogue, block, *range(14))
            parent = tree.insert(parent, key, tree.allocate(64), tree.allocate(64), f"conversation-{dialogue}")
            tree.add_owner(parent, "shared-prefix-owner")
    added = _tracked() - before
    tree.check_invariants()
    assert tree.num_blocks == BLOCKS
    assert added <= 2 * BLOCKS + 10, added / BLOCKS
