"""Block accounting: exact block ids, window release on sliding groups, no leaks (seeded random ops)."""

from __future__ import annotations

import random

import pytest

from salon.engine.kv.block_pool import BlockPool
from salon.engine.kv.kv_cache_manager import KVCacheManager
from salon.engine.kv.kv_layout import plan_groups, plan_layout
from salon.engine.model.config import LayerSpec, ModelConfig, synthetic_config
from tests.model_configs import gemma3_270m_config


def tiny_layout(num_blocks: int, window: int = 32, block_size: int = 16):
    cfg = synthetic_config("synthetic-tiny")
    if window != 32:
        layers = tuple(
            LayerSpec(s.attention, window if s.attention == "sliding" else None, s.rope_base, s.kv_source_layer)
            for s in cfg.layers
        )
        cfg = ModelConfig(**{**cfg.__dict__, "layers": layers})
    probe = plan_layout(cfg, block_size, 1 << 30)
    return plan_layout(cfg, block_size, num_blocks * probe.page_bytes)


def test_gemma_groups_follow_the_hybrid_plan():
    slots, groups = plan_groups(gemma3_270m_config())
    assert slots == 3
    assert [g.layer_ids for g in groups] == [(5, 11, 17), (0, 1, 2), (3, 4, 6), (7, 8, 9), (10, 12, 13), (14, 15, 16)]
    assert [g.sliding_window_tokens for g in groups] == [None, 512, 512, 512, 512, 512]
    layout = plan_layout(gemma3_270m_config(), 16, 100 * 24960)
    # page = 3 layers x 16 tokens x (K + V) x (256 int8 + 4-byte scale), one KV head
    assert layout.page_bytes == 3 * 16 * 2 * (256 + 4) == 24960
    assert layout.num_blocks == 100


def test_sharing_layers_allocate_nothing():
    layout = tiny_layout(64)
    # synthetic-tiny: layer 0 sliding, 1 global, 2 reuses 0, 3 reuses 1.
    assert [g.layer_ids for g in layout.groups] == [(1,), (0,)]
    assert layout.layer_locations[2] == layout.layer_locations[0]
    assert layout.layer_locations[3] == layout.layer_locations[1]
    assert layout.page_bytes == 16 * 2 * 2 * (16 + 4)


def test_exact_block_ids_and_free_order():
    kv = KVCacheManager(tiny_layout(20))
    assert kv.allocate_slots("a", 0, 20)  # 2 blocks per group: global gets 0,1; sliding 2,3
    assert kv.block_tables("a") == [[0, 1], [2, 3]]
    assert kv.allocate_slots("b", 0, 5)
    assert kv.block_tables("b") == [[4], [5]]
    assert kv.allocate_slots("a", 20, 12)  # tokens 20..31: still 2 blocks each
    assert kv.block_tables("a") == [[0, 1], [2, 3]]
    assert kv.allocate_slots("a", 32, 1)  # token 32: block index 2 in both groups
    assert kv.block_tables("a") == [[0, 1, 6], [2, 3, 7]]
    assert kv.num_free_blocks == 20 - 8
    assert kv.free("a") == 6
    assert kv.num_free_blocks == 18
    # Freed tail-first after the never-used ids: 8..19 then 7, 3, 2, 6, 1, 0.
    assert kv.pool.allocate(18) == list(range(8, 20)) + [7, 3, 2, 6, 1, 0]


def test_sliding_group_releases_blocks_out_of_the_window():
    kv = KVCacheManager(tiny_layout(80, window=32))
    assert kv.allocate_slots("a", 0, 64)  # positions 0..63: 4 blocks per group
    assert kv.num_held_blocks("a") == 8
    # Next query at 64 sees keys >= 33: blocks 0 and 1 (positions 0..31) of the sliding group go.
    assert kv.allocate_slots("a", 64, 1)
    global_table, sliding_table = kv.block_tables("a")
    assert len(global_table) == 5 and None not in global_table
    assert sliding_table[:2] == [None, None] and None not in sliding_table[2:]
    # Decode far: the sliding group stays bounded while the global one grows.
    for pos in range(65, 1000):
        assert kv.allocate_slots("a", pos, 1)
        held_sliding = sum(b is not None for b in kv.block_tables("a")[1])
        assert held_sliding <= -(-(32 - 1 + 1) // 16) + 1
    assert sum(b is not None for b in kv.block_tables("a")[0]) == -(-1000 // 16)
    kv.free("a")
    assert kv.num_free_blocks == 80


def test_all_or_nothing_allocation():
    kv = KVCacheManager(tiny_layout(5))
    assert kv.allocate_slots("a", 0, 32)  # 2 + 2 blocks
    before = (kv.num_free_blocks, [list(t) for t in kv.block_tables("a")])
    assert not kv.allocate_slots("b", 0, 17)  # needs 4, 1 free
    assert not kv.allocate_slots("a", 32, 17)
    assert (kv.num_free_blocks, [list(t) for t in kv.block_tables("a")]) == before
    assert kv.can_allocate("a", 32, 1) is False


def test_double_free_is_caught():
    pool = BlockPool(4)
    ids = pool.allocate(2)
    pool.free(ids)
    with pytest.raises(RuntimeError):
        pool.free(ids[:1])


@pytest.mark.parametrize("seed", range(5))
def test_random_ops_conserve_blocks(seed):
    rng = random.Random(seed)
    layout = tiny_layout(80, window=rng.choice([16, 32, 40]))
    kv = KVCacheManager(layout)
    computed: dict[str, int] = {}
    for step in range(2000):
        op = rng.random()
        if op < 0.15 or not computed:
            rid = f"r{step}"
            n = rng.randint(1, 100)
            if kv.allocate_slots(rid, 0, n):
                computed[rid] = n
            else:
                assert rid not in kv._tables
        elif op < 0.3:
            rid = rng.choice(sorted(computed))
            kv.free(rid)
            del computed[rid]
        else:
            rid = rng.choice(sorted(computed))
            n = rng.randint(1, 40)
            if kv.allocate_slots(rid, computed[rid], n):
                computed[rid] += n
        held = sum(kv.num_held_blocks(r) for r in computed)
        assert held + kv.num_free_blocks == layout.num_blocks
        ids = [b for r in computed for t in kv.block_tables(r) for b in t if b is not None]
        assert len(ids) == len(set(ids))
        for r, n in computed.items():
            g_table, s_table = kv.block_tables(r)
            assert len(g_table) == -(-n // 16) and None not in g_table
    for r in list(computed):
        kv.free(r)
    assert kv.num_free_blocks == layout.num_blocks
