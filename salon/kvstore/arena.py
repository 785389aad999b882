"""The shared-memory arena where every stored KV byte lives.

A file in a tmpfs directory (normally /dev/shm), created by the kvstore with mode 0600, sized to
capacity and pre-touched (every page written once at start, so no page fault lands on the fetch path).
The kvstore reads and writes it through a memoryview; engines on the same host map the same file
(salon/common/kvstore_contract/arena_mapping.py) and read fetched blocks / write put blocks at
offsets the kvstore hands out under a lease. Which byte ranges are in use is decided by
ExtentAllocator, not here.

Free bytes are zero: the arena starts zeroed and `zero` clears every extent the tree frees (evicted,
dropped, abandoned), so a freed block's KV does not outlive it and unwritten space never holds
another namespace's bytes.

Writers: an engine that maps the arena holds a writer lock on it (salon/common/kvstore_contract/
writer_lock.py) while it can write; `writer_alive` tells whether a writer's process still does.

Ownership is an exclusive `flock` held on the file for the life of the process (the kernel drops it
when the process dies, however it dies). `remove_stale_arenas` deletes arena files nobody holds
locked: after a SIGKILL or an OOM kill the next start reclaims the memory even when the new process
has the old one's pid (PID 1 in a container). A new arena is created and locked under a temporary
name and renamed into place, so a concurrent scan never sees it unlocked.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
from pathlib import Path

import numpy as np

from salon.common.kvstore_contract.writer_lock import writer_lock_held
from salon.kvstore.allocator import Extent

ARENA_PREFIX = "salon-kvstore-"
_TMP_PREFIX = ".tmp-salon-kvstore-"


class Arena:
    def __init__(self, directory: str, size_bytes: int) -> None:
        token = f"{os.getpid()}-{secrets.token_hex(4)}"
        tmp = Path(directory) / f"{_TMP_PREFIX}{token}"
        self.path = Path(directory) / f"{ARENA_PREFIX}{token}"
        self.size_bytes = size_bytes
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, size_bytes)
            os.rename(tmp, self.path)
            self._mmap = mmap.mmap(fd, size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            self.path.unlink(missing_ok=True)
            raise
        self._lock_fd = fd  # held open: the flock says this arena is in use
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

    def zero(self, extent: Extent) -> None:
        self.array[extent.offset : extent.offset + extent.length] = 0

    def fill(self, extent: Extent, pattern: np.ndarray) -> None:
        """Write `pattern` (uint8, at least extent.length bytes) over the extent."""
        self.array[extent.offset : extent.offset + extent.length] = pattern[: extent.length]

    def writer_alive(self, writer_id: int) -> bool:
        """True if a process still holds writer lock `writer_id` on this arena."""
        return writer_lock_held(self._lock_fd, writer_id)

    def close(self) -> None:
        self.array = None  # type: ignore[assignment]
        self.view.release()
        try:
            self._mmap.close()
        except BufferError:  # a view is still exported somewhere; the mapping goes with the process
            pass
        self.path.unlink(missing_ok=True)
        os.close(self._lock_fd)


def remove_stale_arenas(directory: str) -> list[Path]:
    """Delete this user's arena files that no process holds locked; returns them."""
    removed = []
    for path in [*Path(directory).glob(f"{ARENA_PREFIX}*"), *Path(directory).glob(f"{_TMP_PREFIX}*")]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_uid != os.getuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live kvstore holds it
            path.unlink(missing_ok=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed
