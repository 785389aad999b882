"""Extents of the shared-memory arena: which byte ranges hold KV and which are free.

Pure bookkeeping over [0, capacity_bytes): no memory is touched here. Every extent is aligned to
ALIGN_BYTES and occupies `aligned(length)` bytes of the arena; `length` is what the caller asked for.

Free space is a set of maximal free runs (adjacent free runs are always merged on free):

    |  used  |   free run   | used |      free run       |
             ^start          ^end                          (end = start + run length)

Allocation is best fit: the smallest free run that is long enough, split if longer (KV blocks come
in a few fixed sizes, so exact fits are the common case and fragmentation stays small). When no run
is long enough, allocate returns None and the caller evicts something and retries.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

ALIGN_BYTES = 64


def aligned(num_bytes: int) -> int:
    return (num_bytes + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


@dataclass(frozen=True, slots=True)
class Extent:
    """A byte range of the arena holding one payload: [offset, offset + length)."""

    offset: int
    length: int


class ExtentAllocator:
    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes // ALIGN_BYTES * ALIGN_BYTES
        # Free runs: start -> length, end -> start, and run length -> starts (with its sizes sorted).
        self._run_length: dict[int, int] = {}
        self._run_start_by_end: dict[int, int] = {}
        self._starts_by_length: dict[int, set[int]] = {}
        self._lengths: list[int] = []
        # Arena bytes held by allocated extents (aligned sizes).
        self.allocated_bytes = 0
        if self.capacity_bytes:
            self._add_run(0, self.capacity_bytes)

    def allocate(self, length: int) -> Extent | None:
        """A free extent of `length` bytes, or None when no free run is long enough."""
        if length <= 0:
            raise ValueError(f"length must be positive, got {length}")
        size = aligned(length)
        i = bisect.bisect_left(self._lengths, size)
        if i == len(self._lengths):
            return None
        run_length = self._lengths[i]
        start = next(iter(self._starts_by_length[run_length]))
        self._remove_run(start, run_length)
        if run_length > size:
            self._add_run(start + size, run_length - size)
        self.allocated_bytes += size
        return Extent(start, length)

    def free(self, extent: Extent) -> None:
        """Return an extent; it merges with the free runs on either side."""
        start, size = extent.offset, aligned(extent.length)
        self.allocated_bytes -= size
        end = start + size
        before = self._run_start_by_end.get(start)
        if before is not None:
            self._remove_run(before, start - before)
            start = before
        after_length = self._run_length.get(end)
        if after_length is not None:
            self._remove_run(end, after_length)
            end += after_length
        self._add_run(start, end - start)

    def free_runs(self) -> list[tuple[int, int]]:
        """Sorted (start, length) of the free runs (for tests and stats)."""
        return sorted(self._run_length.items())

    def largest_free_run(self) -> int:
        return self._lengths[-1] if self._lengths else 0

    def _add_run(self, start: int, length: int) -> None:
        self._run_length[start] = length
        self._run_start_by_end[start + length] = start
        starts = self._starts_by_length.get(length)
        if starts is None:
            self._starts_by_length[length] = {start}
            bisect.insort(self._lengths, length)
        else:
            starts.add(start)

    def _remove_run(self, start: int, length: int) -> None:
        del self._run_length[start]
        del self._run_start_by_end[start + length]
        starts = self._starts_by_length[length]
        starts.remove(start)
        if not starts:
            del self._starts_by_length[length]
            del self._lengths[bisect.bisect_left(self._lengths, length)]
