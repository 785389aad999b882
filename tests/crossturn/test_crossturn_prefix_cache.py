"""DevicePrefixCache as a data structure: seeded random inserts, takes and reclaims against a plain model."""

import random

import pytest

from services.common.prefix_hash import block_hashes
from services.engine.core.kv_cache_manager import KVCacheManager
from services.engine.kv.kv_layout import plan_layout
from services.engine.kv.prefix_cache import DevicePrefixCache
from services.engine.model.config import synthetic_config
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
            max_tokens = (len(query) - 1) // BS * BS
            hit = cache.lookup(make_request("q", query, namespace=NS))
            if hit is not None:
                n = hit.num_tokens
                tables = cache.take(hit)
                assert 0 < n <= max_tokens and n % BS == 0
                # The hit really is a stored prefix of the query.
                assert any(t[:n] == query[:n] for t in stored)
                assert all(len(t) == n // BS for t in tables)
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
    import services.engine.core.request as request_module

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
