"""Routing policy: exact decisions on hand-built loads, and the load bound under skewed random load."""

from __future__ import annotations

import math
import random

import pytest

from salon.gateway.ring import HashRing
from salon.gateway.routing import (
    BoundedLoadPolicy,
    EngineLoad,
    LeastLoadedPolicy,
    bounded_capacity,
    make_policy,
)
from salon.gateway.types import DialogueKey, EngineId

E = [EngineId(f"e{i}") for i in range(3)]


def loads(*counts: int, accepting=(True, True, True), saturated=(False, False, False)) -> dict[EngineId, EngineLoad]:
    return {E[i]: EngineLoad(E[i], counts[i], accepting[i], saturated[i]) for i in range(len(counts))}


def key_owned_by(owner: EngineId) -> DialogueKey:
    ring = HashRing(E)
    return next(DialogueKey(f"c{i}") for i in range(10_000) if ring.owner(f"c{i}") == owner)


def test_capacity_formula() -> None:
    assert bounded_capacity(0, 3, 1.25) == 1  # ceil(1.25 * 1 / 3)
    assert bounded_capacity(11, 3, 1.25) == 5  # ceil(1.25 * 12 / 3)
    assert bounded_capacity(12, 4, 1.0) == 4  # ceil(13/4)
    assert bounded_capacity(11, 3, 1.25, min_capacity=8) == 8
    assert bounded_capacity(40, 3, 1.25, min_capacity=8) == 18


def test_min_capacity_keeps_low_load_dialogues_home() -> None:
    conv = key_owned_by(E[0])
    # Textbook rule: one stream on the owner (cap ceil(1.25*2/3) = 1) already spills.
    assert BoundedLoadPolicy(min_capacity=1).choose(conv, loads(1, 0, 0), None).engine_id != E[0]
    d = BoundedLoadPolicy(min_capacity=8).choose(conv, loads(7, 0, 0), None)
    assert (d.engine_id, d.spilled) == (E[0], False)
    d = BoundedLoadPolicy(min_capacity=8).choose(conv, loads(8, 0, 0), None)
    assert d.spilled


def test_home_is_ring_owner_when_idle() -> None:
    policy = BoundedLoadPolicy(min_capacity=1)
    for owner in E:
        conv = key_owned_by(owner)
        d = policy.choose(conv, loads(0, 0, 0), None)
        assert (d.engine_id, d.sticky_hit, d.moved, d.spilled, d.ring_owner) == (owner, False, False, False, owner)


def test_spill_to_next_on_ring_when_owner_full() -> None:
    policy = BoundedLoadPolicy(load_factor=1.25, min_capacity=1)
    conv = key_owned_by(E[0])
    order = list(HashRing(E).preference(conv))
    counts = {order[0]: 8, order[1]: 2, order[2]: 2}  # total 12 -> cap ceil(1.25*13/3) = 6
    d = policy.choose(conv, {e: EngineLoad(e, counts[e]) for e in E}, None)
    assert d.engine_id == order[1] and d.spilled and not d.moved and d.ring_owner == order[0]
    # The second choice full too: the third.
    counts = {order[0]: 8, order[1]: 8, order[2]: 0}  # total 16 -> cap 8
    d = policy.choose(conv, {e: EngineLoad(e, counts[e]) for e in E}, None)
    assert d.engine_id == order[2] and d.spilled


def test_sticky_engine_wins_over_ring_owner() -> None:
    policy = BoundedLoadPolicy(min_capacity=1)
    conv = key_owned_by(E[0])
    d = policy.choose(conv, loads(0, 0, 0), E[2])
    assert (d.engine_id, d.sticky_hit, d.moved, d.spilled) == (E[2], True, False, False)


def test_sticky_engine_gone_moves_to_ring() -> None:
    policy = BoundedLoadPolicy(min_capacity=1)
    conv = key_owned_by(E[0])
    d = policy.choose(conv, loads(0, 0, 0, accepting=(True, True, False)), E[2])
    assert (d.engine_id, d.sticky_hit, d.moved, d.spilled) == (E[0], False, True, False)
    d = policy.choose(conv, loads(0, 0, 0), E[2], exclude=frozenset({E[2]}))
    assert (d.engine_id, d.moved) == (E[0], True)


def test_sticky_engine_full_spills() -> None:
    policy = BoundedLoadPolicy(min_capacity=1)
    conv = key_owned_by(E[0])
    d = policy.choose(conv, loads(1, 1, 9), E[2])  # cap ceil(1.25*12/3)=5
    assert (d.engine_id, d.sticky_hit, d.moved, d.spilled) == (E[0], False, True, True)


def test_saturated_engine_is_skipped_and_none_when_nobody_accepts() -> None:
    policy = BoundedLoadPolicy(min_capacity=1)
    conv = key_owned_by(E[0])
    d = policy.choose(conv, loads(0, 0, 0, saturated=(True, False, False)), None)
    assert d.engine_id != E[0] and d.spilled
    assert policy.choose(conv, loads(0, 0, 0, accepting=(False, False, False)), None) is None
    assert policy.choose(conv, loads(0, 0, 0), None, exclude=frozenset(E)) is None


def test_unhealthy_engine_leaves_ring_only_its_keys_move() -> None:
    policy = BoundedLoadPolicy(load_factor=1e9)  # pure consistent hashing
    keys = [DialogueKey(f"c{i}") for i in range(3000)]
    before = {k: policy.choose(k, loads(0, 0, 0), None).engine_id for k in keys}
    after = {k: policy.choose(k, loads(0, 0, 0, accepting=(True, False, True)), None).engine_id for k in keys}
    for k in keys:
        if before[k] != E[1]:
            assert after[k] == before[k]
        else:
            assert after[k] != E[1]


def test_load_factor_below_one_rejected() -> None:
    with pytest.raises(ValueError):
        BoundedLoadPolicy(load_factor=0.9)
    with pytest.raises(ValueError):
        make_policy("random")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bounded_load_respected_under_skew(seed: int) -> None:
    """Zipf-skewed dialogues arrive and finish at random; every placement respects the bound."""
    rng = random.Random(seed)
    engine_ids = [EngineId(f"e{i}") for i in range(5)]
    c = 1.25
    policy = BoundedLoadPolicy(load_factor=c, min_capacity=1)
    pure = BoundedLoadPolicy(load_factor=1e9)
    conversations = [DialogueKey(f"conv-{i}") for i in range(50)]
    weights = [1.0 / (rank + 1) ** 1.3 for rank in range(len(conversations))]
    active: dict[EngineId, int] = {e: 0 for e in engine_ids}
    pure_active: dict[EngineId, int] = {e: 0 for e in engine_ids}
    streams: list[EngineId] = []
    pure_streams: list[EngineId] = []
    worst_pure_ratio = 0.0
    for _ in range(4000):
        if streams and rng.random() < 0.45:
            i = rng.randrange(len(streams))
            active[streams.pop(i)] -= 1
            pure_active[pure_streams.pop(i)] -= 1
            continue
        conv = rng.choices(conversations, weights)[0]
        snapshot = {e: EngineLoad(e, active[e]) for e in engine_ids}
        d = policy.choose(conv, snapshot, None)
        active[d.engine_id] += 1
        streams.append(d.engine_id)
        total = sum(active.values())
        assert active[d.engine_id] <= math.ceil(c * total / len(engine_ids))
        p = pure.choose(conv, {e: EngineLoad(e, pure_active[e]) for e in engine_ids}, None)
        pure_active[p.engine_id] += 1
        pure_streams.append(p.engine_id)
        worst_pure_ratio = max(worst_pure_ratio, max(pure_active.values()) / math.ceil(c * total / 5))
    # The workload is skewed enough that unbounded consistent hashing breaks the bound.
    assert worst_pure_ratio > 1.5


def test_least_loaded_policy() -> None:
    policy = LeastLoadedPolicy()
    d = policy.choose(DialogueKey("x"), loads(3, 1, 2), E[0])
    assert (d.engine_id, d.sticky_hit, d.moved) == (E[1], False, True)
    d = policy.choose(DialogueKey("x"), loads(3, 1, 1), None)
    assert d.engine_id == E[1]  # tie broken by id
