"""DevicePrefixCache as a data structure: seeded random inserts, takes and reclaims against a plain model."""

import random

import pytest

from salon.common.prefix_hash import block_hashes
from salon.engine.kv.kv_cache_manager import KVCacheManager
from salon.engine.kv.kv_layout import plan_layout
from salon.engine.model.config import synthetic_config
from salon.engine.prefix.device_cache import DevicePrefixCache
from tests.engine_testlib import make_request

BS = 4
NS = b"n" * 32


def _tables(kv, num_tokens):
    """Allocate tables as a request of num_tokens computed tokens would hold them, then detach them."""
    kv.allocate_slots("tmp", 0, num_tokens)
    return kv.detach("tmp")


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_keep_blocks_accounted_and_hits_verified(seed):
    rng = random.Random(seed)
    kv = KVCacheManager(plan_layout(synthetic_config("synthetic-tiny"), BS, 400 * 2 * 2 * BS * 2 * (16 + 4)))
    cache = DevicePrefixCache(kv)
    stored: list[list[int]] = []  # the model: token lists the cache may hold
    stems = [[rng.randrange(50) for _ in range(40)] for _ in range(3)]
    for _ in range(300):
        op = rng.random()
        if op < 0.5:
            tokens = rng.choice(stems)[: rng.randrange(BS, 40)] + [rng.randrange(50) for _ in range(rng.randrange(8))]
            if kv.can_allocate("tmp", 0, len(tokens)):
                tables = _tables(kv, len(tokens))
                full = len(tokens) // BS * BS
                cache.insert(NS, tokens, tables, block_hashes(NS, tokens[:full], BS))
                stored.append(tokens)
        elif op < 0.85:
            query = rng.choice(stems)[: rng.randrange(BS + 1, 40)]
            hit = cache.lookup(make_request("q", query, namespace=NS))
            if hit is not None:
                n = hit.num_tokens
                entry = hit.entry
                tables = cache.take(hit)
                # At least the query's last token is left; the hit really is a prefix of the query that the
                # entry holds, whole blocks by hash and then as far into the next block as they agree.
                assert BS <= n <= len(query) - 1
                assert entry.token_ids[:n] == query[:n] and len(entry.token_ids) >= n
                # A hit that ends inside a block ends where the tokens (or the entry, or the query) end.
                assert n % BS == 0 or n == min(len(query) - 1, len(entry.token_ids)) or entry.token_ids[n] != query[n]
                assert all(len(t) == -(-n // BS) for t in tables)
                kv.free_tables(tables)
        else:
            cache.reclaim(rng.randrange(1, 20))
        held = cache.num_reclaimable_blocks()
        assert kv.num_free_blocks + held == kv.layout.num_blocks
        assert held == sum(e.num_blocks_held() for e in cache._entries.values())
        indexed = {id(e) for holders in cache._by_hash.values() for e in holders}
        assert indexed == set(cache._entries)
    cache.clear()
    assert kv.num_free_blocks == kv.layout.num_blocks and not cache._by_hash


def test_forced_hash_collision_on_the_real_lookup_path_is_a_miss(monkeypatch):
    """Every block hash collides (requests hash through a function that ignores the tokens): the device
    cache still answers by the stored tokens -- a miss for other tokens, never their KV."""
    import salon.engine.request as request_module

    def colliding(namespace, token_ids, block_size, parent=None):
        return [bytes([i % 256]) * 32 for i in range(len(token_ids) // block_size)]

    monkeypatch.setattr(request_module, "block_hashes", colliding)
    kv = KVCacheManager(plan_layout(synthetic_config("synthetic-tiny"), BS, 400 * 2 * 2 * BS * 2 * (16 + 4)))
    cache = DevicePrefixCache(kv)
    a, b = list(range(100, 121)), list(range(300, 321))
    stored = make_request("a", a, namespace=NS)
    cache.insert(NS, a[:20], _tables(kv, 20), stored.block_hashes(20, BS))
    other = make_request("b", b, namespace=NS)
    assert other.block_hashes(20, BS) == stored.block_hashes(20, BS)  # the collision is real
    assert cache.lookup(other) is None
    hit = cache.lookup(make_request("a2", a, namespace=NS))
    assert hit is not None and hit.num_tokens == 20


def test_a_hit_runs_on_into_the_block_the_entry_ends_inside():
    """Exact: an entry of 22 tokens (5 whole blocks of 4, then 2), a query sharing its first 21 tokens: a hit of
    21 tokens with the entry's first 6 blocks, its last one the block the hit ends inside; the entry's other
    blocks go back to the pool. A query that is the entry's tokens exactly leaves its last token to compute; one
    that differs at a block boundary gets whole blocks only."""
    kv = KVCacheManager(plan_layout(synthetic_config("synthetic-tiny"), BS, 400 * 2 * 2 * BS * 2 * (16 + 4)))
    cache = DevicePrefixCache(kv)
    stored = list(range(100, 122))

    def insert():
        tables = _tables(kv, len(stored))
        cache.insert(NS, stored, tables, block_hashes(NS, stored[:20], BS))
        return [list(t) for t in tables]

    tables = insert()
    free = kv.num_free_blocks
    hit = cache.lookup(make_request("q", stored[:21] + [7, 8, 9], namespace=NS))
    assert hit is not None and hit.num_tokens == 21
    assert cache.take(hit) == [t[:6] for t in tables]
    assert kv.num_free_blocks == free + sum(len(t) - 6 for t in tables) and cache.num_entries == 0
    kv.free_tables([t[:6] for t in tables])

    insert()
    assert cache.lookup(make_request("q", stored, namespace=NS)).num_tokens == 21
    assert cache.lookup(make_request("q", stored[:12] + [7] * 9, namespace=NS)).num_tokens == 12
    assert cache.lookup(make_request("q", stored[:14], namespace=NS)).num_tokens == 13
    cache.clear()
    assert kv.num_free_blocks == kv.layout.num_blocks
