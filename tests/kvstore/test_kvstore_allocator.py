"""The arena's extent allocator: best fit, splitting, merging, against a byte-map reference."""

from __future__ import annotations

import random

from salon.kvstore.allocator import ALIGN_BYTES, Extent, ExtentAllocator, aligned


def test_best_fit_split_and_merge() -> None:
    alloc = ExtentAllocator(1000)  # rounded down to 960 = 15 units of 64
    assert alloc.capacity_bytes == 960 and alloc.free_runs() == [(0, 960)]
    a, b, c = alloc.allocate(64), alloc.allocate(100), alloc.allocate(64)
    assert (a, b, c) == (Extent(0, 64), Extent(64, 100), Extent(192, 64))
    assert alloc.allocated_bytes == 256
    alloc.free(a)
    alloc.free(c)
    assert alloc.free_runs() == [(0, 64), (192, 768)]
    assert alloc.allocate(60) == Extent(0, 60)  # best fit: the 64-byte hole, not the big run
    assert alloc.allocate(1000) is None
    alloc.free(Extent(0, 60))
    alloc.free(b)  # merges with both neighbours
    assert alloc.free_runs() == [(0, 960)] and alloc.allocated_bytes == 0
    assert alloc.largest_free_run() == 960


def test_random_against_byte_map() -> None:
    rng = random.Random(5)
    alloc = ExtentAllocator(64 * 200)
    owner = [None] * (alloc.capacity_bytes // ALIGN_BYTES)  # per 64-byte unit: which extent holds it
    live: list[Extent] = []
    for step in range(5000):
        if live and rng.random() < 0.45:
            extent = live.pop(rng.randrange(len(live)))
            alloc.free(extent)
            for u in range(extent.offset // 64, (extent.offset + aligned(extent.length)) // 64):
                owner[u] = None
        else:
            length = rng.choice([64, 100, 300, 1000, 2500])
            extent = alloc.allocate(length)
            units = aligned(length) // 64
            has_room = any(all(o is None for o in owner[i : i + units]) for i in range(len(owner) - units + 1))
            assert (extent is not None) == has_room  # free runs are always merged: never a false "full"
            if extent is None:
                continue
            for u in range(extent.offset // 64, extent.offset // 64 + units):
                assert owner[u] is None
                owner[u] = step
            live.append(extent)
        assert alloc.allocated_bytes == sum(aligned(e.length) for e in live)
        free_units = sum(length for _, length in alloc.free_runs()) // 64
        assert free_units == owner.count(None)
