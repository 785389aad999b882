"""Compiled grammars by constraint, least recently used first out, within a byte bound.

A compiled grammar's size is what the grammar library reports for it (its token-mask cache dominates). An
entry larger than the whole bound is returned to its caller but never kept. Not thread-safe: the compiler
calls it from the event loop only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class CompiledCache(Generic[V]):
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Hashable, value: V, num_bytes: int) -> None:
        """Keep value (replacing any under key), evicting least recently used entries to stay in the bound."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.num_bytes -= old[1]
        if num_bytes > self.capacity_bytes:
            return
        while self.num_bytes + num_bytes > self.capacity_bytes:
            _, (_, evicted_bytes) = self._entries.popitem(last=False)
            self.num_bytes -= evicted_bytes
        self._entries[key] = (value, num_bytes)
        self.num_bytes += num_bytes
