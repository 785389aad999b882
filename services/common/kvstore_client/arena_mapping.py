"""An engine's mapping of the kvstore's shared-memory arena (services/kvstore/arena.py creates it).

Engines on the kvstore's host read fetched blocks and write put blocks straight into the arena file,
at offsets the kvstore hands out under a lease; the lease, not this mapping, says which bytes are theirs.
"""

from __future__ import annotations

import mmap
import os

import numpy as np


class ArenaMapping:
    """An engine's mapping of a kvstore's arena (read and write)."""

    def __init__(self, name: str) -> None:
        self.name = name
        fd = os.open(name, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            # MAP_POPULATE maps every page now: otherwise each first access to an arena page from this
            # process is a page fault, which costs more than copying the page.
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._mmap = mmap.mmap(fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self._mmap, dtype=np.uint8)

    def close(self) -> None:
        self.array = None  # type: ignore[assignment]
        try:
            self._mmap.close()
        except BufferError:
            pass
