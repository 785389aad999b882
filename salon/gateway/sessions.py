"""Session table: where each dialogue was last served, so its next turn goes back there.

An entry maps a dialogue (types.DialogueKey: tenant + conversation id) to an engine id and expires `ttl_s` after it was
last written.
The router treats an entry as a hint: if the engine is gone (unhealthy, draining, removed) or
full, the dialogue moves and the entry is overwritten.

`claim` is the write used for a dialogue without an entry: it stores the engine only if no entry
exists and returns whichever engine holds the entry afterwards. With a shared store (Redis) two
gateway replicas placing the same new dialogue at once therefore agree on one engine.

This module holds the interface and the in-process table (the default; one gateway replica).
The Redis table is in sessions_redis.py.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from salon.gateway.types import DialogueKey, EngineId


class SessionTable(Protocol):
    # True when operations cross the network (writes nobody waits for then run in the background).
    remote: bool

    async def get(self, dialogue_key: DialogueKey) -> EngineId | None: ...

    async def put(self, dialogue_key: DialogueKey, engine_id: EngineId) -> None: ...

    async def claim(self, dialogue_key: DialogueKey, engine_id: EngineId) -> EngineId: ...

    async def delete(self, dialogue_key: DialogueKey) -> bool:
        """Forget the dialogue (DeleteConversation); False if the store could not confirm it."""
        ...

    async def close(self) -> None: ...


class InMemorySessionTable:
    """A dict with per-entry expiry and a size bound (least recently written entries go first)."""

    remote = False

    def __init__(self, ttl_s: float, max_entries: int = 1_000_000, clock: Callable[[], float] = time.monotonic):
        if ttl_s <= 0 or max_entries < 1:
            raise ValueError("ttl_s must be > 0 and max_entries >= 1")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        # dialogue key -> (engine id, expiry time); ordered by last write, oldest first.
        self._entries: OrderedDict[DialogueKey, tuple[EngineId, float]] = OrderedDict()

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
        return True

    async def close(self) -> None:
        self._entries.clear()
