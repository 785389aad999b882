"""Stored responses in the session tables (the Responses API's records): kept for the TTL, bounded in
bytes (in memory), per tenant, and erased with their dialogue by `delete` (DeleteConversation), in
memory and in a real redis-server."""

from __future__ import annotations

import random

from gateway_helpers import redis_server  # noqa: F401 - fixture

from salon.gateway.sessions import InMemorySessionTable
from salon.gateway.sessions_redis import RedisSessionTable
from salon.gateway.types import EngineId, TenantId, dialogue_key, response_key

A, B = TenantId("tenant-a"), TenantId("tenant-b")


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


async def test_memory_records_expire_exactly_at_the_ttl() -> None:
    clock = FakeClock()
    table = InMemorySessionTable(ttl_s=5.0, clock=clock)
    assert await table.put_response(dialogue_key(A, "c"), response_key(A, "r1"), "one")
    clock.now_s += 4.999
    assert await table.get_response(response_key(A, "r1")) == "one"
    clock.now_s += 0.001
    assert await table.get_response(response_key(A, "r1")) is None
    assert len(table.responses) == 0 and table.responses.num_bytes == 0


async def test_memory_records_are_per_tenant_and_erased_with_their_dialogue() -> None:
    table = InMemorySessionTable(ttl_s=60.0)
    await table.put(dialogue_key(A, "c"), EngineId("e0"))
    await table.put_response(dialogue_key(A, "c"), response_key(A, "r1"), "a-c-1")
    await table.put_response(dialogue_key(A, "c"), response_key(A, "r2"), "a-c-2")
    await table.put_response(dialogue_key(A, "d"), response_key(A, "r3"), "a-d-3")
    await table.put_response(dialogue_key(B, "c"), response_key(B, "r4"), "b-c-4")
    assert await table.get_response(response_key(B, "r1")) is None
    assert await table.delete(dialogue_key(A, "c"))
    assert await table.get(dialogue_key(A, "c")) is None
    assert await table.get_response(response_key(A, "r1")) is None
    assert await table.get_response(response_key(A, "r2")) is None
    assert await table.get_response(response_key(A, "r3")) == "a-d-3"
    assert await table.get_response(response_key(B, "r4")) == "b-c-4"
    assert await table.delete_response(response_key(A, "r3"))
    assert await table.get_response(response_key(A, "r3")) is None


async def test_memory_records_are_bounded_in_bytes_oldest_first() -> None:
    """Seeded random puts, deletes and dialogue deletes against a dict model: the oldest records go
    first once the total passes the bound, and the byte count matches the records kept."""
    rng = random.Random(7)
    max_bytes = 200
    table = InMemorySessionTable(ttl_s=60.0, max_response_bytes=max_bytes)
    model: dict[str, tuple[str, str]] = {}  # response key -> (record, dialogue key), oldest first
    for step in range(5_000):
        op = rng.random()
        dialogue = dialogue_key(A, f"c{rng.randrange(5)}")
        key = response_key(A, f"r{rng.randrange(30)}")
        if op < 0.7:
            record = "é" * rng.randrange(0, 60)  # two bytes each
            stored = await table.put_response(dialogue, key, record)
            assert stored == (len(record.encode()) <= max_bytes)
            if stored:
                model.pop(key, None)
                model[key] = (record, dialogue)
                while sum(len(r.encode()) for r, _ in model.values()) > max_bytes:
                    del model[next(iter(model))]
        elif op < 0.85:
            await table.delete_response(key)
            model.pop(key, None)
        else:
            await table.delete(dialogue)
            model = {k: v for k, v in model.items() if v[1] != dialogue}
        if step % 50 == 0:
            for k in (response_key(A, f"r{i}") for i in range(30)):
                assert await table.get_response(k) == (model[k][0] if k in model else None)
        assert table.responses.num_bytes == sum(len(r.encode()) for r, _ in model.values()) <= max_bytes


async def test_redis_records_per_tenant_with_ttl_erased_with_their_dialogue(redis_server) -> None:  # noqa: F811
    a = RedisSessionTable(redis_server.url, ttl_s=60.0)
    b = RedisSessionTable(redis_server.url, ttl_s=60.0)  # a second gateway replica
    try:
        await a.put(dialogue_key(A, "c"), EngineId("e0"))
        assert await a.put_response(dialogue_key(A, "c"), response_key(A, "r1"), "a-c-1")
        assert await a.put_response(dialogue_key(A, "c"), response_key(A, "r2"), "a-c-2")
        assert await a.put_response(dialogue_key(A, "d"), response_key(A, "r3"), "a-d-3")
        assert await a.put_response(dialogue_key(B, "c"), response_key(B, "r4"), "b-c-4")
        assert await b.get_response(response_key(A, "r1")) == "a-c-1"
        assert await b.get_response(response_key(B, "r1")) is None
        ttl_ms = await a._redis.pttl(a.response_prefix + response_key(A, "r1"))
        assert 59_000 < ttl_ms <= 60_000
        assert await b.delete(dialogue_key(A, "c"))
        assert await a.get(dialogue_key(A, "c")) is None
        assert await a.get_response(response_key(A, "r1")) is None
        assert await a.get_response(response_key(A, "r2")) is None
        assert await a._redis.exists(a.responses_index_prefix + dialogue_key(A, "c")) == 0
        assert await a.get_response(response_key(A, "r3")) == "a-d-3"
        assert await a.get_response(response_key(B, "r4")) == "b-c-4"
        assert await a.delete_response(response_key(A, "r3"))
        assert await b.get_response(response_key(A, "r3")) is None
    finally:
        await a.close()
        await b.close()


async def test_redis_down_stores_nothing_and_says_so(redis_server) -> None:  # noqa: F811
    table = RedisSessionTable(redis_server.url, ttl_s=60.0, retry_interval_s=60.0)
    try:
        assert await table.put_response(dialogue_key(A, "c"), response_key(A, "r1"), "kept")
        redis_server.kill()
        assert not await table.put_response(dialogue_key(A, "c"), response_key(A, "r2"), "lost")
        assert await table.get_response(response_key(A, "r1")) is None and not table.available
        assert not await table.delete(dialogue_key(A, "c"))
    finally:
        await table.close()
