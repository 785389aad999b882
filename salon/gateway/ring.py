"""A consistent-hash ring with virtual nodes.

Each engine owns `vnodes_per_engine` points on a 64-bit ring; a key belongs to the first point
clockwise from the key's own hash. Adding or removing one of N engines moves only the keys of that
engine's arcs, ~1/N of all keys.

    0 ............................................................. 2^64-1
      e1#7    e0#2   key-> e2#5   e0#9        e1#3 ...    (points sorted by hash)
                           ^ owner of key

`preference(key)` walks clockwise from the key and yields each distinct engine once: the owner
first, then the engine a key moves to when the owner is skipped (full, unhealthy, draining).
Two gateway replicas with the same member set build identical rings (the hash is fixed, not
Python's per-process `hash`), so they agree on owners without talking to each other.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Iterator

from salon.gateway.types import EngineId

DEFAULT_VNODES_PER_ENGINE = 160


def ring_hash(data: str) -> int:
    """64-bit position on the ring: first 8 bytes of BLAKE2b (stable across processes and hosts)."""
    return int.from_bytes(hashlib.blake2b(data.encode("utf-8"), digest_size=8).digest(), "big")


class HashRing:
    """Immutable ring over a set of engine ids; build a new one when membership changes."""

    def __init__(self, engine_ids: Iterable[EngineId], vnodes_per_engine: int = DEFAULT_VNODES_PER_ENGINE):
        if vnodes_per_engine < 1:
            raise ValueError("vnodes_per_engine must be >= 1")
        self.engine_ids: frozenset[EngineId] = frozenset(engine_ids)
        self.vnodes_per_engine = vnodes_per_engine
        # Ties between points (astronomically rare) are broken by engine id so the order is total.
        points = sorted(
            (ring_hash(f"{engine_id}#{i}"), engine_id)
            for engine_id in self.engine_ids
            for i in range(vnodes_per_engine)
        )
        self._hashes: list[int] = [h for h, _ in points]
        self._owners: list[EngineId] = [e for _, e in points]

    def __len__(self) -> int:
        return len(self.engine_ids)

    def owner(self, key: str) -> EngineId | None:
        """The engine owning `key`, or None on an empty ring."""
        if not self._hashes:
            return None
        idx = bisect.bisect_right(self._hashes, ring_hash(key)) % len(self._hashes)
        return self._owners[idx]

    def preference(self, key: str) -> Iterator[EngineId]:
        """Distinct engines in clockwise order from `key`'s position: owner first, every engine once."""
        if not self._hashes:
            return
        start = bisect.bisect_right(self._hashes, ring_hash(key))
        seen: set[EngineId] = set()
        num_points = len(self._hashes)
        for step in range(num_points):
            engine_id = self._owners[(start + step) % num_points]
            if engine_id not in seen:
                seen.add(engine_id)
                yield engine_id
                if len(seen) == len(self.engine_ids):
                    return
