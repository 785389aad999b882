"""Exact tests of the radix tree and store: match lengths, usable rule, eviction order, pins, drops."""

from __future__ import annotations

import pytest
from kvstore_testlib import LAYOUT, NS_A, NS_B, fetch_bytes, make_store, payload, put

from salon.common.kvstore_contract.layout import KVLayout, MatchResult
from salon.common.prefix_hash import encode_token_ids
from salon.kvstore.radix_tree import LayoutMismatch

GLOBAL_ONLY = G = KVLayout(4, 64, 0, 0)


def match(store, tokens, ns=NS_A, layout=LAYOUT) -> MatchResult:
    return store.match(ns, layout, encode_token_ids(tokens))


def test_window_blocks() -> None:
    assert KVLayout(16, 1, 1, 512).window_blocks == 32  # Gemma 3: keys (p-512, p) lie in the last 32 blocks
    assert KVLayout(16, 1, 1, 513).window_blocks == 32
    assert KVLayout(16, 1, 1, 514).window_blocks == 33
    assert KVLayout(4, 1, 1, 5).window_blocks == 1
    assert KVLayout(4, 1, 0, 0).window_blocks == 0
    assert KVLayout(4, 1, 1, 1).window_blocks == 0  # a window of 1 sees only the token itself
    assert KVLayout(4, 1, 1, 5).needed_local_blocks(0) == 0
    assert LAYOUT.problems() == []
    assert KVLayout(0, 0, 5, 0).problems() == [
        "layout.block_size_tokens must be positive",
        "layout.global_bytes_per_block must be positive",
        "layout.local_bytes_per_block must be 0 when sliding_window_tokens is 0",
    ]


def test_match_lengths_block_granularity(tmp_path) -> None:
    store = make_store(tmp_path, 1 << 16)
    ctx = list(range(100, 112))  # 3 blocks
    put(store, NS_A, ctx, layout=GLOBAL_ONLY)
    assert match(store, ctx, layout=GLOBAL_ONLY) == MatchResult(12, 12)
    assert match(store, ctx + [1, 2, 3, 4, 5], layout=GLOBAL_ONLY) == MatchResult(12, 12)
    assert match(store, ctx[:11], layout=GLOBAL_ONLY) == MatchResult(8, 8)  # partial tail block never matches
    edited = ctx[:9] + [0] + ctx[10:]  # differs inside block 2
    assert match(store, edited, layout=GLOBAL_ONLY) == MatchResult(8, 8)
    assert match(store, [0] + ctx[1:], layout=GLOBAL_ONLY) == MatchResult(0, 0)
    assert match(store, [], layout=GLOBAL_ONLY) == MatchResult(0, 0)
    assert store.tree.num_blocks == 3
    store.tree.check_invariants()


def test_usable_vs_matched_with_window(tmp_path) -> None:
    # Window 9 tokens with 4-token blocks: a continuation at block boundary k needs local KV of
    # blocks k-2 and k-1 (keys (p-9, p) = [p-8, p) span two blocks).
    layout = KVLayout(4, 64, 128, 9)
    assert layout.window_blocks == 2
    store = make_store(tmp_path, 1 << 16)
    ctx = list(range(24))  # 6 blocks; local KV stored for blocks 3, 4, 5 only
    put(store, NS_A, ctx, local_blocks={3, 4, 5}, layout=layout)
    assert match(store, ctx, layout=layout) == MatchResult(24, 24)  # continue: needs 4, 5
    assert match(store, ctx[:20] + [999] * 4, layout=layout) == MatchResult(20, 20)  # regenerate last: 3, 4
    assert match(store, ctx[:16] + [999] * 8, layout=layout) == MatchResult(16, 0)  # needs 2, 3: 2 missing
    assert match(store, ctx[:4] + [999] * 8, layout=layout) == MatchResult(4, 0)  # needs block 0
    # Local KV for the early blocks makes short prefixes usable too.
    put(store, NS_A, ctx[:8], local_blocks={0, 1}, layout=layout)
    assert match(store, ctx[:4], layout=layout) == MatchResult(4, 4)
    assert match(store, ctx[:8], layout=layout) == MatchResult(8, 8)
    assert match(store, ctx[:12], layout=layout) == MatchResult(12, 8)  # k=3 needs 1, 2: 2 missing; k=2 ok
    assert match(store, ctx[:16] + [7] * 4, layout=layout) == MatchResult(16, 8)
    # A model without sliding layers: usable == matched.
    put(store, NS_B, ctx, layout=GLOBAL_ONLY)
    assert match(store, ctx, ns=NS_B, layout=GLOBAL_ONLY) == MatchResult(24, 24)
    store.tree.check_invariants()


def test_fetch_returns_stored_bytes_and_window_locals(tmp_path) -> None:
    layout = KVLayout(4, 64, 128, 9)
    store = make_store(tmp_path, 1 << 16)
    ctx = list(range(50, 74))
    put(store, NS_A, ctx, local_blocks={2, 3, 4, 5}, layout=layout)
    num_tokens, blocks = fetch_bytes(store, NS_A, ctx + [1], layout=layout)
    assert num_tokens == 24
    for i, (g, loc) in enumerate(blocks):
        assert g == payload(NS_A, ctx, i, "g", 64, 4)
        # only the window before the match point (blocks 4, 5) carries local KV
        assert loc == (payload(NS_A, ctx, i, "l", 128, 4) if i >= 4 else None)
    num_tokens, blocks = fetch_bytes(store, NS_A, ctx, layout=layout, max_tokens=19)  # at most 4 blocks
    assert num_tokens == 16 and [loc is not None for _, loc in blocks] == [False, False, True, True]
    assert store.tree.stats().num_blocks == 6
    assert all(n.pins == 0 for n in store.tree.attached_nodes())


def test_put_is_idempotent_and_adds_missing_local(tmp_path) -> None:
    store = make_store(tmp_path, 1 << 16)
    ctx = list(range(12))
    first = put(store, NS_A, ctx)
    assert (first.stored_blocks, first.existing_blocks) == (3, 0)
    used = store.tree.used_bytes
    assert used == 3 * 64
    again = put(store, NS_A, ctx)
    assert (again.stored_blocks, again.existing_blocks) == (0, 3)
    assert store.tree.used_bytes == used
    with_local = put(store, NS_A, ctx, local_blocks={2})
    assert (with_local.stored_blocks, with_local.existing_blocks) == (0, 3)
    assert store.tree.used_bytes == used + 128
    assert match(store, ctx) == MatchResult(12, 12)
    # A put may skip blocks it knows are stored; unknown parents stop it.
    longer = ctx + list(range(200, 208))
    skipping = put(store, NS_A, longer, first_block=3)
    assert (skipping.stored_blocks, skipping.skipped_blocks) == (2, 0)
    orphan = put(store, NS_A, [9] * 8 + list(range(8)), first_block=2)
    assert (orphan.stored_blocks, orphan.skipped_blocks) == (0, 2)
    store.tree.check_invariants()


def test_eviction_order_is_lru_over_leaves(tmp_path) -> None:
    store = make_store(tmp_path, 5 * 64)  # room for exactly 5 global-only blocks
    a, b, c, d = [10, 11, 12, 13, 14, 15, 16, 17], [20, 21, 22, 23, 24, 25, 26, 27], [30] * 4, [40] * 4
    put(store, NS_A, a, layout=GLOBAL_ONLY)
    put(store, NS_A, b, layout=GLOBAL_ONLY)
    fetch_bytes(store, NS_A, a, layout=GLOBAL_ONLY)  # a is now more recent than b
    put(store, NS_A, c, layout=GLOBAL_ONLY)  # fills the store: nothing evicted
    assert store.tree.used_bytes == 5 * 64 and store.tree.evicted_blocks == 0
    counts = put(store, NS_A, d, layout=GLOBAL_ONLY)  # evicts b's leaf (b1)
    assert counts.evicted_blocks == 1
    assert match(store, b, layout=GLOBAL_ONLY) == MatchResult(4, 4)
    assert match(store, a, layout=GLOBAL_ONLY) == MatchResult(8, 8)
    counts = put(store, NS_A, [50] * 8, layout=GLOBAL_ONLY)  # evicts b0, then a1 (oldest leaves)
    assert counts.evicted_blocks == 2
    assert match(store, b, layout=GLOBAL_ONLY) == MatchResult(0, 0)
    assert match(store, a, layout=GLOBAL_ONLY) == MatchResult(4, 4)
    assert match(store, c, layout=GLOBAL_ONLY) == MatchResult(4, 4)
    assert match(store, d, layout=GLOBAL_ONLY) == MatchResult(4, 4)
    store.tree.check_invariants()


def test_old_local_kv_goes_before_global(tmp_path) -> None:
    store = make_store(tmp_path, 2 * (64 + 128) + (64 + 128) + 2 * 64)
    x = list(range(12))
    put(store, NS_A, x[:8], local_blocks={0, 1})  # turn 1: window locals for blocks 0, 1
    put(store, NS_A, x, local_blocks={2})  # turn 2: touches x0, x1 globals, not their locals
    put(store, NS_A, [7] * 8)  # another dialogue: store is full now
    assert store.tree.used_bytes == store.tree.capacity_bytes
    assert match(store, x) == MatchResult(12, 12)
    put(store, NS_A, [8] * 8)  # needs 128 bytes: the oldest local payload (x0's) is enough
    assert (store.tree.evicted_local_blocks, store.tree.evicted_blocks) == (1, 0)
    assert match(store, x) == MatchResult(12, 12)  # the continuation point is still usable
    assert match(store, x[:8] + [0] * 4) == MatchResult(8, 8)  # x1's local survives
    put(store, NS_A, [9] * 4)  # next oldest: x1's local, then leaves
    assert (store.tree.evicted_local_blocks, store.tree.evicted_blocks) == (2, 0)
    assert match(store, x[:8] + [0] * 4) == MatchResult(8, 0)
    store.tree.check_invariants()


def test_pinned_entries_are_never_evicted(tmp_path) -> None:
    store = make_store(tmp_path, 4 * 64)
    a = list(range(16))
    put(store, NS_A, a, layout=GLOBAL_ONLY)
    plan = store.begin_fetch(NS_A, GLOBAL_ONLY, encode_token_ids(a), 0)
    assert plan.num_tokens == 16
    counts = put(store, NS_A, [5] * 8, layout=GLOBAL_ONLY)  # no room, everything pinned
    assert (counts.stored_blocks, counts.skipped_blocks, counts.evicted_blocks) == (0, 2, 0)
    assert [bytes(store.arena.read(n.global_extent)) for n in plan.nodes] == [
        payload(NS_A, a, i, "g", 64, 4) for i in range(4)
    ]
    store.end_fetch(plan)
    counts = put(store, NS_A, [5] * 8, layout=GLOBAL_ONLY)
    assert (counts.stored_blocks, counts.evicted_blocks) == (2, 2)
    assert match(store, a, layout=GLOBAL_ONLY) == MatchResult(8, 8)
    store.tree.check_invariants()


def test_namespace_isolation_and_layout_mismatch(tmp_path) -> None:
    store = make_store(tmp_path, 1 << 16)
    ctx = list(range(8))
    put(store, NS_A, ctx, local_blocks={0, 1})
    assert match(store, ctx, ns=NS_B) == MatchResult(0, 0)
    assert fetch_bytes(store, NS_B, ctx) == (0, [])
    with pytest.raises(LayoutMismatch, match="layout"):
        match(store, ctx, layout=KVLayout(4, 32, 128, 5))


def test_drop_conversation_keeps_shared_prefix(tmp_path) -> None:
    store = make_store(tmp_path, 1 << 16)
    shared = list(range(8))
    put(store, NS_A, shared + [1] * 4, owner="c1", layout=G)
    put(store, NS_A, shared + [2] * 8, owner="c2", layout=G)
    assert store.tree.num_blocks == 5
    assert store.drop(NS_A, "c1") == 1  # only c1's own last block; the prefix is c2's too
    assert match(store, shared + [1] * 4, layout=G) == MatchResult(8, 8)
    assert match(store, shared + [2] * 8, layout=G) == MatchResult(16, 16)
    assert store.drop(NS_A, "c2") == 4
    assert store.tree.num_blocks == 0 and store.tree.used_bytes == 0
    put(store, NS_A, shared, layout=G)
    assert store.drop(NS_A, "") == 2 and match(store, shared, layout=G) == MatchResult(0, 0)
    store.tree.check_invariants()


def test_drop_while_pinned_frees_on_release(tmp_path) -> None:
    store = make_store(tmp_path, 1 << 16)
    ctx = list(range(8))
    put(store, NS_A, ctx, layout=G)
    plan = store.begin_fetch(NS_A, G, encode_token_ids(ctx), 0)
    assert store.drop(NS_A, "") == 2
    assert match(store, ctx, layout=G) == MatchResult(0, 0)
    assert store.tree.used_bytes == 2 * 64  # still readable by the pinned fetch
    assert bytes(store.arena.read(plan.nodes[1].global_extent)) == payload(NS_A, ctx, 1, "g", 64, 4)
    store.tree.check_invariants()
    store.end_fetch(plan)
    assert store.tree.used_bytes == 0
    store.tree.check_invariants()


def test_blocks_are_keyed_by_their_exact_tokens_not_a_hash(tmp_path) -> None:
    """The tree has no hash to collide: each child is keyed by its block's token bytes, so a context that
    differs from a stored one in any single token of a block diverges at that block -- a shorter match,
    never the other context's KV for it."""
    store = make_store(tmp_path, 1 << 16)
    a = list(range(12))
    put(store, NS_A, a, layout=G)
    for changed_at, expect_blocks in ((0, 0), (3, 0), (4, 1), (9, 2), (11, 2)):
        b = list(a)
        b[changed_at] += 1000
        assert match(store, b, layout=G).matched_tokens == 4 * expect_blocks, changed_at
        n, rows = fetch_bytes(store, NS_A, b, layout=G)
        assert n == 4 * expect_blocks and [g for g, _ in rows] == [
            payload(NS_A, a, i, "g", 64, 4) for i in range(expect_blocks)
        ]
    assert match(store, a, layout=G).matched_tokens == 12


def test_shared_put_and_fetch_leases(tmp_path) -> None:
    now = [0.0]
    store = make_store(tmp_path, 1 << 16, lease_ttl_s=10.0, clock=lambda: now[0])
    ctx = list(range(16))
    tb = encode_token_ids(ctx)
    put(store, NS_A, ctx[:8])
    lease, slots, existing = store.prepare_shared_put(NS_A, LAYOUT, tb, "c", 4, frozenset({3}))
    assert existing == 2
    assert [(s.block_index, s.global_extent is not None, s.local_extent is not None) for s in slots] == [
        (2, True, False),
        (3, True, True),
    ]
    for s in slots:
        store.arena.write(s.global_extent, payload(NS_A, ctx, s.block_index, "g", 64, 4))
        if s.local_extent:
            store.arena.write(s.local_extent, payload(NS_A, ctx, s.block_index, "l", 128, 4))
    counts = store.commit_shared_put(lease)
    assert (counts.stored_blocks, counts.existing_blocks) == (2, 2)
    assert store.commit_shared_put(lease) is None  # a lease is used once
    num_tokens, blocks = fetch_bytes(store, NS_A, ctx)
    assert num_tokens == 16 and blocks[3] == (payload(NS_A, ctx, 3, "g", 64, 4), payload(NS_A, ctx, 3, "l", 128, 4))
    # A fetch lease pins until released; an expired put lease quarantines its reservation until its
    # writer ends it (here: a late commit, refused), however late.
    plan = store.begin_fetch(NS_A, LAYOUT, tb, 0)
    fetch_lease = store.lease_fetch(plan)
    assert all(n.pins == 1 for n in plan.nodes)
    assert store.release_lease(fetch_lease) and not store.release_lease(fetch_lease)
    assert all(n.pins == 0 for n in plan.nodes)
    used = store.tree.used_bytes
    lease, slots, _ = store.prepare_shared_put(NS_A, LAYOUT, encode_token_ids([3] * 8), "", 2, frozenset())
    assert store.tree.used_bytes == used + 128
    now[0] = 11.0
    assert store.expire_leases() == 1
    assert store.tree.used_bytes == used + 128 and store.quarantined_bytes == 128  # not reusable yet
    now[0] = 11.0 + 100 * store.lease_ttl_s
    assert store.release_quarantine() == 0 and store.quarantined_bytes == 128
    assert store.commit_shared_put(lease) is None
    assert store.tree.used_bytes == used and store.quarantined_bytes == 0
    store.tree.check_invariants()
