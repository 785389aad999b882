"""Hash ring: agreement with a brute-force reference, even split, ~1/N movement on membership change."""

from __future__ import annotations

import collections
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from salon.gateway.ring import HashRing, ring_hash
from salon.gateway.types import EngineId


def engines(n: int) -> list[EngineId]:
    return [EngineId(f"e{i}") for i in range(n)]


def reference_preference(engine_ids, key: str, vnodes: int) -> list[EngineId]:
    """Plain reference: sort all points, walk from the first point strictly after the key's hash."""
    points = sorted((ring_hash(f"{e}#{i}"), e) for e in engine_ids for i in range(vnodes))
    h = ring_hash(key)
    start = next((i for i, (p, _) in enumerate(points) if p > h), 0)
    order: list[EngineId] = []
    for i in range(len(points)):
        e = points[(start + i) % len(points)][1]
        if e not in order:
            order.append(e)
    return order


@settings(max_examples=60, deadline=None)
@given(
    num_engines=st.integers(min_value=1, max_value=6),
    vnodes=st.integers(min_value=1, max_value=20),
    keys=st.lists(st.text(min_size=0, max_size=20), min_size=1, max_size=20),
)
def test_ring_matches_reference(num_engines: int, vnodes: int, keys: list[str]) -> None:
    ring = HashRing(engines(num_engines), vnodes)
    for key in keys:
        expected = reference_preference(engines(num_engines), key, vnodes)
        assert list(ring.preference(key)) == expected
        assert ring.owner(key) == expected[0]


def test_empty_ring() -> None:
    ring = HashRing([])
    assert ring.owner("x") is None
    assert list(ring.preference("x")) == []


def test_hash_is_stable_across_processes() -> None:
    # Literals computed once: replicas (and restarts, and upgrades) must agree on positions, so neither the hash
    # nor the placement of a key may ever change.
    assert ring_hash("conv-1") == 11089325264343481520
    assert ring_hash("") == 16476032584258269876
    assert ring_hash("e0#0") == 1665524033367879423
    ring = HashRing(engines(3))
    assert list(ring.preference("conv-1")) == ["e1", "e2", "e0"]
    assert list(ring.preference("conv-2")) == ["e0", "e2", "e1"]
    assert list(ring.preference("c0ffee")) == ["e2", "e0", "e1"]
    named = HashRing([EngineId(f"engine-{i}") for i in range(5)])
    assert [named.owner(k) for k in ("conv-1", "conv-2", "conv-3", "alice/dialogue-7")] == [
        "engine-0",
        "engine-2",
        "engine-0",
        "engine-3",
    ]
    assert HashRing(engines(3)).owner("conv-1") == HashRing(list(reversed(engines(3)))).owner("conv-1")


@pytest.mark.parametrize("num_engines", [3, 5, 8])
def test_distribution_is_even(num_engines: int) -> None:
    ring = HashRing(engines(num_engines))
    num_keys = 30_000
    counts = collections.Counter(ring.owner(f"conv-{k}") for k in range(num_keys))
    assert set(counts) == set(engines(num_engines))
    for engine_id, count in counts.items():
        share_of_fair = count * num_engines / num_keys
        assert 0.85 <= share_of_fair <= 1.15, (engine_id, share_of_fair)


@pytest.mark.parametrize("num_engines", [2, 3, 4, 5, 6, 7])
def test_adding_an_engine_moves_about_one_nth(num_engines: int) -> None:
    before = HashRing(engines(num_engines))
    after = HashRing(engines(num_engines + 1))
    new_engine = engines(num_engines + 1)[-1]
    keys = [f"conv-{k}" for k in range(20_000)]
    moved = [k for k in keys if before.owner(k) != after.owner(k)]
    # Every moved key moved to the new engine; nothing shuffles between old engines.
    assert all(after.owner(k) == new_engine for k in moved)
    assert len(moved) / len(keys) <= 1.35 / (num_engines + 1)


def test_removing_an_engine_moves_only_its_keys_to_its_successor() -> None:
    rng = random.Random(7)
    full = HashRing(engines(5))
    for removed in engines(5):
        reduced = HashRing([e for e in engines(5) if e != removed])
        for _ in range(2000):
            key = f"c{rng.getrandbits(48)}"
            if full.owner(key) != removed:
                assert reduced.owner(key) == full.owner(key)
            else:
                # The key goes where the full ring's preference list said it would go next.
                assert reduced.owner(key) == list(full.preference(key))[1]
