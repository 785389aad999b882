"""Session table in Redis, shared by every gateway replica, that degrades instead of failing.

Keys: `<key_prefix><tenant id>/<conversation id>` -> engine id, with a TTL (PX) refreshed on every write.
`claim` is one round trip: `SET key engine NX PX ttl GET` (Redis >= 7.0) returns the existing
holder, or nil when this call created the entry.

Stored responses (sessions.py): `<response_prefix><tenant id>/<response id>` -> record, and the
dialogue's set `<responses_index_prefix><tenant id>/<conversation id>` -> {response keys}, both written
with the TTL in one MULTI. `delete` erases the dialogue's entry, its responses and the set in one Lua
script (atomic: a response written meanwhile is either erased or written after).

The connection pool is a BlockingConnectionPool: when all `max_connections` are busy a caller
waits up to `pool_timeout_s` for one instead of failing at once. Every operation is bounded by
`op_timeout_s`.

Degraded mode: when an operation fails (Redis down, timeout, pool exhausted) the table logs once,
sets salon_gateway_session_store_up to 0, and answers as if it had no entry (`get` -> None,
`claim` -> the caller's engine, `put` -> no-op), so the router falls back to the ring and the
gateway keeps serving. For `retry_interval_s` after a failure it does not touch Redis at all (so a
dead Redis costs nothing per request); the next operation after that tries again, and the first
success logs the recovery and sets the gauge back to 1.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from salon.common.logging import get_logger
from salon.gateway import metrics
from salon.gateway.types import DialogueKey, EngineId, ResponseKey

log = get_logger(__name__)

T = TypeVar("T")

# KEYS: the dialogue's entry, its set of response keys; ARGV: the prefix of response keys.
_DELETE_DIALOGUE = """
for _, key in ipairs(redis.call('SMEMBERS', KEYS[2])) do redis.call('DEL', ARGV[1] .. key) end
redis.call('DEL', KEYS[2])
return redis.call('DEL', KEYS[1])
"""


class RedisSessionTable:
    remote = True

    def __init__(
        self,
        url: str,
        ttl_s: float,
        key_prefix: str = "salon:gateway:session:",
        max_connections: int = 32,
        pool_timeout_s: float = 0.2,
        op_timeout_s: float = 0.2,
        retry_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        response_prefix: str = "salon:gateway:response:",
        responses_index_prefix: str = "salon:gateway:responses:",
    ):
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.key_prefix = key_prefix
        self.response_prefix = response_prefix
        self.responses_index_prefix = responses_index_prefix
        self.op_timeout_s = op_timeout_s
        self.retry_interval_s = retry_interval_s
        self._clock = clock
        self._pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=pool_timeout_s,
            socket_timeout=op_timeout_s,
            socket_connect_timeout=op_timeout_s,
            decode_responses=True,
        )
        self._redis = aioredis.Redis(connection_pool=self._pool)
        self._skip_until_s = 0.0
        self.available = True
        metrics.SESSION_STORE_UP.labels(store="redis").set(1)

    def _key(self, dialogue_key: DialogueKey) -> str:
        return self.key_prefix + dialogue_key

    async def _call(self, op: str, fn: Callable[[], Awaitable[T]]) -> tuple[bool, T | None]:
        """(True, result) on success; (False, None) when Redis failed or is being skipped."""
        if not self.available and self._clock() < self._skip_until_s:
            return False, None
        try:
            result = await asyncio.wait_for(fn(), timeout=self.op_timeout_s)
        except (TimeoutError, RedisError, OSError) as exc:
            metrics.SESSION_STORE_ERRORS.labels(op=op).inc()
            self._skip_until_s = self._clock() + self.retry_interval_s
            if self.available:
                self.available = False
                metrics.SESSION_STORE_UP.labels(store="redis").set(0)
                log.warning(
                    "session_store_down", op=op, error=type(exc).__name__, detail=str(exc)[:200], fallback="ring"
                )
            return False, None
        if not self.available:
            self.available = True
            metrics.SESSION_STORE_UP.labels(store="redis").set(1)
            log.info("session_store_up")
        return True, result

    async def get(self, dialogue_key: DialogueKey) -> EngineId | None:
        _, value = await self._call("get", lambda: self._redis.get(self._key(dialogue_key)))
        return EngineId(value) if value else None

    async def put(self, dialogue_key: DialogueKey, engine_id: EngineId) -> None:
        await self._call("put", lambda: self._redis.set(self._key(dialogue_key), engine_id, px=self.ttl_ms))

    async def claim(self, dialogue_key: DialogueKey, engine_id: EngineId) -> EngineId:
        key = self._key(dialogue_key)
        _, holder = await self._call(
            "claim", lambda: self._redis.set(key, engine_id, px=self.ttl_ms, nx=True, get=True)
        )
        return EngineId(holder) if holder else engine_id

    async def delete(self, dialogue_key: DialogueKey) -> bool:
        keys = (self._key(dialogue_key), self.responses_index_prefix + dialogue_key)
        ok, _ = await self._call("delete", lambda: self._redis.eval(_DELETE_DIALOGUE, 2, *keys, self.response_prefix))
        return ok

    async def put_response(self, dialogue_key: DialogueKey, response_key: ResponseKey, record: str) -> bool:
        index = self.responses_index_prefix + dialogue_key

        async def write():
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(self.response_prefix + response_key, record, px=self.ttl_ms)
                pipe.sadd(index, response_key)
                pipe.pexpire(index, self.ttl_ms)
                return await pipe.execute()

        ok, _ = await self._call("put_response", write)
        return ok

    async def get_response(self, response_key: ResponseKey) -> str | None:
        _, value = await self._call("get_response", lambda: self._redis.get(self.response_prefix + response_key))
        return value

    async def delete_response(self, response_key: ResponseKey) -> bool:
        ok, _ = await self._call("delete_response", lambda: self._redis.delete(self.response_prefix + response_key))
        return ok

    async def close(self) -> None:
        await self._redis.aclose()
        await self._pool.disconnect()
