"""Session tables: the in-memory one against a plain dict model, and the Redis one against a real
redis-server (including Redis going down and coming back)."""

from __future__ import annotations

import asyncio
import random
import time

from gateway_helpers import RedisServer, redis_server  # noqa: F401 - fixture

from salon.gateway import metrics
from salon.gateway.sessions import InMemorySessionTable
from salon.gateway.sessions_redis import RedisSessionTable
from salon.gateway.types import DialogueKey, EngineId


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


async def test_memory_table_against_model() -> None:
    """Seeded random get/put/claim/time steps; compare with a dict of (engine, expiry)."""
    rng = random.Random(11)
    clock = FakeClock()
    ttl_s, max_entries = 10.0, 20
    table = InMemorySessionTable(ttl_s=ttl_s, max_entries=max_entries, clock=clock)
    model: dict[str, tuple[str, float, int]] = {}  # conv -> (engine, expiry, write serial)
    serial = 0
    for _ in range(20_000):
        conv = DialogueKey(f"c{rng.randrange(40)}")
        engine = EngineId(f"e{rng.randrange(4)}")
        op = rng.random()
        live = {k: v for k, v in model.items() if v[1] > clock.now_s}
        if op < 0.35:
            expected = live[conv][0] if conv in live else None
            assert await table.get(conv) == expected
        elif op < 0.65:
            await table.put(conv, engine)
            serial += 1
            model[conv] = (engine, clock.now_s + ttl_s, serial)
        elif op < 0.9:
            expected = live[conv][0] if conv in live else engine
            assert await table.claim(conv, engine) == expected
            if conv not in live:
                serial += 1
                model[conv] = (engine, clock.now_s + ttl_s, serial)
        else:
            clock.now_s += rng.uniform(0, 4)
        # The size bound drops the least recently written entries.
        if len(model) > max_entries:
            for conv_id, _ in sorted(model.items(), key=lambda kv: kv[1][2])[: len(model) - max_entries]:
                del model[conv_id]
        assert len(table) <= max_entries


async def test_memory_table_ttl_exact() -> None:
    clock = FakeClock()
    table = InMemorySessionTable(ttl_s=5.0, clock=clock)
    await table.put(DialogueKey("a"), EngineId("e1"))
    clock.now_s += 4.999
    assert await table.get(DialogueKey("a")) == "e1"
    await table.put(DialogueKey("a"), EngineId("e1"))  # refresh
    clock.now_s += 4.999
    assert await table.get(DialogueKey("a")) == "e1"
    clock.now_s += 0.001
    assert await table.get(DialogueKey("a")) is None
    assert await table.claim(DialogueKey("a"), EngineId("e2")) == "e2"


async def test_redis_table(redis_server) -> None:  # noqa: F811
    a = RedisSessionTable(redis_server.url, ttl_s=60.0)
    b = RedisSessionTable(redis_server.url, ttl_s=60.0)  # a second gateway replica
    try:
        conv = DialogueKey("dialogue/ü-1")
        assert await a.get(conv) is None
        assert await a.claim(conv, EngineId("e1")) == "e1"
        # The second replica's claim loses and learns the holder.
        assert await b.claim(conv, EngineId("e2")) == "e1"
        assert await b.get(conv) == "e1"
        await b.put(conv, EngineId("e2"))
        assert await a.get(conv) == "e2"
        ttl_ms = await a._redis.pttl(a._key(conv))
        assert 59_000 < ttl_ms <= 60_000
    finally:
        await a.close()
        await b.close()


async def test_redis_ttl_expires(redis_server) -> None:  # noqa: F811
    table = RedisSessionTable(redis_server.url, ttl_s=0.2)
    try:
        await table.put(DialogueKey("x"), EngineId("e0"))
        assert await table.get(DialogueKey("x")) == "e0"
        deadline = time.monotonic() + 10.0
        while await table.get(DialogueKey("x")) is not None:  # expired by redis within a few TTLs
            assert time.monotonic() < deadline, "the entry outlived its TTL"
            await asyncio.sleep(0.05)
    finally:
        await table.close()


async def test_redis_pool_waits_instead_of_failing(redis_server) -> None:  # noqa: F811
    """More concurrent operations than pooled connections: all succeed (callers wait for a slot)."""
    table = RedisSessionTable(redis_server.url, ttl_s=60.0, max_connections=2, pool_timeout_s=2.0, op_timeout_s=2.0)
    try:
        convs = [DialogueKey(f"c{i}") for i in range(50)]
        await asyncio.gather(*(table.put(c, EngineId(f"e{i % 3}")) for i, c in enumerate(convs)))
        got = await asyncio.gather(*(table.get(c) for c in convs))
        assert got == [f"e{i % 3}" for i in range(50)]
        assert table.available
    finally:
        await table.close()


async def test_redis_down_falls_back_then_recovers() -> None:
    server = RedisServer().start()
    restarted: RedisServer | None = None
    table = RedisSessionTable(server.url, ttl_s=60.0, op_timeout_s=0.2, retry_interval_s=0.3)
    try:
        await table.put(DialogueKey("c"), EngineId("e1"))
        assert await table.get(DialogueKey("c")) == "e1"
        errors_before = metrics.SESSION_STORE_ERRORS.labels(op="get")._value.get()
        server.kill()
        # Down: answers "no entry" quickly instead of raising; the caller routes by the ring.
        started = time.monotonic()
        assert await table.get(DialogueKey("c")) is None
        assert await table.claim(DialogueKey("c"), EngineId("e2")) == "e2"
        await table.put(DialogueKey("c"), EngineId("e2"))
        assert time.monotonic() - started < 1.0
        assert not table.available
        assert metrics.SESSION_STORE_UP.labels(store="redis")._value.get() == 0
        assert metrics.SESSION_STORE_ERRORS.labels(op="get")._value.get() == errors_before + 1
        # Back (empty, no persistence): picked up again after the retry interval.
        restarted = RedisServer(server.port).start()
        await asyncio.sleep(0.35)
        await table.put(DialogueKey("c"), EngineId("e3"))
        assert table.available and metrics.SESSION_STORE_UP.labels(store="redis")._value.get() == 1
        assert await table.get(DialogueKey("c")) == "e3"
    finally:
        await table.close()
        server.stop()
        if restarted is not None:
            restarted.stop()
