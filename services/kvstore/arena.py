"""The shared-memory arena where every stored KV byte lives.

A file in a tmpfs directory (normally /dev/shm), created by the kvstore, sized to capacity and
pre-touched (every page written once at start, so no page fault lands on the fetch path). The
kvstore reads and writes it through a memoryview; engines on the same host map the same file
(services/common/kvstore_client/arena_mapping.py) and read fetched blocks / write put blocks at
offsets the kvstore hands out under a lease. Which byte ranges are in use is decided by ExtentAllocator, not here.

The file name carries the owner's pid; `remove_stale_arenas` deletes files of dead owners.
"""

from __future__ import annotations

import mmap
import os
import secrets
from pathlib import Path

import numpy as np

from services.kvstore.allocator import Extent

ARENA_PREFIX = "salon-kvstore-"


class Arena:
    def __init__(self, directory: str, size_bytes: int) -> None:
        self.path = Path(directory) / f"{ARENA_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.size_bytes = size_bytes
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size_bytes)
            self._mmap = mmap.mmap(fd, size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)
        self.view = memoryview(self._mmap)
        self.array = np.frombuffer(self._mmap, dtype=np.uint8)
        self.array[:] = 0  # pre-touch: back every page now

    @property
    def name(self) -> str:
        """What engines open: the arena file's path."""
        return str(self.path)

    def write(self, extent: Extent, data: bytes | memoryview) -> None:
        if len(data) != extent.length:
            raise ValueError(f"payload is {len(data)} bytes, extent holds {extent.length}")
        self.view[extent.offset : extent.offset + extent.length] = data

    def read(self, extent: Extent) -> memoryview:
        """A view of an extent's bytes: valid only while the extent stays allocated (pinned)."""
        return self.view[extent.offset : extent.offset + extent.length]

    def close(self) -> None:
        self.array = None  # type: ignore[assignment]
        self.view.release()
        try:
            self._mmap.close()
        except BufferError:  # a view is still exported somewhere; the mapping goes with the process
            pass
        self.path.unlink(missing_ok=True)


def remove_stale_arenas(directory: str) -> list[Path]:
    """Delete arena files whose owning process is gone; returns them."""
    removed = []
    for path in Path(directory).glob(f"{ARENA_PREFIX}*"):
        try:
            pid = int(path.name[len(ARENA_PREFIX) :].split("-")[0])
        except ValueError:
            continue
        if not _alive(pid):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
