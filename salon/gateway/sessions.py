"""Session table: where each dialogue was last served, so its next turn goes back there.

An entry maps a dialogue (types.DialogueKey: tenant + conversation id) to an engine id and expires `ttl_s` after it was
last written.
The router treats an entry as a hint: if the engine is gone (unhealthy, draining, removed) or
full, the dialogue moves and the entry is overwritten.

`claim` is the write used for a dialogue without an entry: it stores the engine only if no entry
exists and returns whichever engine holds the entry afterwards. With a shared store (Redis) two
gateway replicas placing the same new dialogue at once therefore agree on one engine.

The table also keeps the stored responses of the Responses API (salon/gateway/http/responses.py): an
opaque record per `<tenant>/<response id>` (types.ResponseKey), written with the same `ttl_s`, and
filed under its dialogue so that `delete` (DeleteConversation) erases them with the dialogue.

This module holds the interface and the in-process table (the default; one gateway replica).
The Redis table is in sessions_redis.py.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from salon.gateway.types import DialogueKey, EngineId, ResponseKey

MAX_RESPONSE_BYTES = 256 << 20


class SessionTable(Protocol):
    # True when operations cross the network (writes nobody waits for then run in the background).
    remote: bool
    # False while the store cannot be reached (its answers then are "no entry").
    available: bool

    async def get(self, dialogue_key: DialogueKey) -> EngineId | None: ...

    async def put(self, dialogue_key: DialogueKey, engine_id: EngineId) -> None: ...

    async def claim(self, dialogue_key: DialogueKey, engine_id: EngineId) -> EngineId: ...

    async def delete(self, dialogue_key: DialogueKey) -> bool:
        """Forget the dialogue and its stored responses (DeleteConversation); False if the store could
        not confirm it."""
        ...

    async def put_response(self, dialogue_key: DialogueKey, response_key: ResponseKey, record: str) -> bool:
        """Store a response of the dialogue for ttl_s; False if it was not stored."""
        ...

    async def get_response(self, response_key: ResponseKey) -> str | None: ...

    async def delete_response(self, response_key: ResponseKey) -> bool:
        """Forget one stored response; False if the store could not confirm it."""
        ...

    async def close(self) -> None: ...


class InMemorySessionTable:
    """A dict with per-entry expiry and a size bound (least recently written entries go first); stored
    responses likewise, bounded by their total size in bytes."""

    remote = False
    available = True

    def __init__(
        self,
        ttl_s: float,
        max_entries: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ):
        if ttl_s <= 0 or max_entries < 1:
            raise ValueError("ttl_s must be > 0 and max_entries >= 1")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        # dialogue key -> (engine id, expiry time); ordered by last write, oldest first.
        self._entries: OrderedDict[DialogueKey, tuple[EngineId, float]] = OrderedDict()
        self.responses = _StoredResponses(ttl_s, max_response_bytes, clock)

    def __len__(self) -> int:
        return len(self._entries)

    def _lookup(self, dialogue_key: DialogueKey) -> EngineId | None:
        entry = self._entries.get(dialogue_key)
        if entry is None:
            return None
        engine_id, expires_s = entry
        if expires_s <= self._clock():
            del self._entries[dialogue_key]
            return None
        return engine_id

    def _write(self, dialogue_key: DialogueKey, engine_id: EngineId) -> None:
        self._entries[dialogue_key] = (engine_id, self._clock() + self.ttl_s)
        self._entries.move_to_end(dialogue_key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        # Expired entries at the old end are dropped as writes pass them (amortised O(1)).
        while self._entries:
            oldest_id, (_, expires_s) = next(iter(self._entries.items()))
            if expires_s > self._clock():
                break
            del self._entries[oldest_id]

    async def get(self, dialogue_key: DialogueKey) -> EngineId | None:
        return self._lookup(dialogue_key)

    async def put(self, dialogue_key: DialogueKey, engine_id: EngineId) -> None:
        self._write(dialogue_key, engine_id)

    async def claim(self, dialogue_key: DialogueKey, engine_id: EngineId) -> EngineId:
        holder = self._lookup(dialogue_key)
        if holder is not None:
            return holder
        self._write(dialogue_key, engine_id)
        return engine_id

    async def delete(self, dialogue_key: DialogueKey) -> bool:
        self._entries.pop(dialogue_key, None)
        self.responses.delete_dialogue(dialogue_key)
        return True

    async def put_response(self, dialogue_key: DialogueKey, response_key: ResponseKey, record: str) -> bool:
        return self.responses.put(dialogue_key, response_key, record)

    async def get_response(self, response_key: ResponseKey) -> str | None:
        return self.responses.get(response_key)

    async def delete_response(self, response_key: ResponseKey) -> bool:
        self.responses.delete(response_key)
        return True

    async def close(self) -> None:
        self._entries.clear()
        self.responses.clear()


class _StoredResponses:
    """Records with expiry, at most `max_bytes` of them in all (least recently written go first), each
    filed under its dialogue."""

    def __init__(self, ttl_s: float, max_bytes: int, clock: Callable[[], float]):
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._clock = clock
        # response key -> (record, dialogue key, expiry time, size in bytes); ordered by write, oldest first.
        self._records: OrderedDict[ResponseKey, tuple[str, DialogueKey, float, int]] = OrderedDict()
        self._by_dialogue: dict[DialogueKey, set[ResponseKey]] = {}
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._records)

    def put(self, dialogue_key: DialogueKey, response_key: ResponseKey, record: str) -> bool:
        num_bytes = len(record.encode("utf-8"))
        if num_bytes > self.max_bytes:
            return False
        self.delete(response_key)
        self._records[response_key] = (record, dialogue_key, self._clock() + self.ttl_s, num_bytes)
        self._by_dialogue.setdefault(dialogue_key, set()).add(response_key)
        self.num_bytes += num_bytes
        # Over the bound, or expired, at the old end: dropped as writes pass them.
        while self._records:
            oldest_key, (_, _, expires_s, _) = next(iter(self._records.items()))
            if self.num_bytes <= self.max_bytes and expires_s > self._clock():
                break
            self.delete(oldest_key)
        return True

    def get(self, response_key: ResponseKey) -> str | None:
        entry = self._records.get(response_key)
        if entry is None:
            return None
        if entry[2] <= self._clock():
            self.delete(response_key)
            return None
        return entry[0]

    def delete(self, response_key: ResponseKey) -> None:
        entry = self._records.pop(response_key, None)
        if entry is None:
            return
        _, dialogue_key, _, num_bytes = entry
        self.num_bytes -= num_bytes
        filed = self._by_dialogue[dialogue_key]
        filed.discard(response_key)
        if not filed:
            del self._by_dialogue[dialogue_key]

    def delete_dialogue(self, dialogue_key: DialogueKey) -> None:
        for response_key in list(self._by_dialogue.get(dialogue_key, ())):
            self.delete(response_key)

    def clear(self) -> None:
        self._records.clear()
        self._by_dialogue.clear()
        self.num_bytes = 0
