"""An engine's mapping of the kvstore's shared-memory arena (salon/kvstore/arena.py creates it).

Engines on the kvstore's host read fetched blocks and write put blocks straight into the arena file,
at offsets the kvstore hands out under a lease; the lease, not this mapping, says which bytes are theirs.

The arena's name comes from the kvstore, so it is checked before it is opened: the file must be an
arena file (`salon-kvstore-*`) directly inside the configured directory, a regular file reached without
following a symlink, owned by the kvstore's user and mode 0600 — anything else is refused
(ArenaRefused), and the engine moves KV over gRPC instead. Mapping populates every page (seconds for
a large arena), so callers do it off the event loop.

A mapping holds a writer lock on the arena (`writer_id`, writer_lock.py) for as long as it can write
through it, so the kvstore can tell when this writer is gone.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

import numpy as np

from salon.common.kvstore_contract.writer_lock import take_writer_lock

ARENA_PREFIX = "salon-kvstore-"


class ArenaRefused(OSError):
    """The named file is not an arena this engine may map; the message says why."""


def check_arena_path(name: str, directory: str) -> Path:
    """The arena path if `name` is an arena file directly inside `directory`; ArenaRefused otherwise."""
    path = Path(name)
    if not path.is_absolute() or not path.name.startswith(ARENA_PREFIX) or path.name != os.path.basename(name):
        raise ArenaRefused(f"arena {name!r}: not an absolute path to a {ARENA_PREFIX}* file")
    if os.path.realpath(path.parent) != os.path.realpath(directory):
        raise ArenaRefused(f"arena {name!r}: not inside the configured arena directory {directory}")
    return path


class ArenaMapping:
    """An engine's mapping of a kvstore's arena (read and write)."""

    def __init__(self, name: str, directory: str = "/dev/shm/salon-kvstore", owner_uid: int | None = None) -> None:
        path = check_arena_path(name, directory)
        owner_uid = os.getuid() if owner_uid is None else owner_uid
        self.name = name
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ArenaRefused(f"arena {name!r}: cannot open it ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ArenaRefused(f"arena {name!r}: not a regular file")
            if st.st_uid != owner_uid:
                raise ArenaRefused(f"arena {name!r}: owned by uid {st.st_uid}, not the kvstore's uid {owner_uid}")
            if stat.S_IMODE(st.st_mode) != 0o600:
                raise ArenaRefused(f"arena {name!r}: mode {stat.S_IMODE(st.st_mode):04o}, not 0600")
            # MAP_POPULATE maps every page now: otherwise each first access to an arena page from this
            # process is a page fault, which costs more than copying the page.
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._mmap = mmap.mmap(fd, st.st_size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
            try:
                self.writer_id = take_writer_lock(fd)
            except OSError:  # no locks here: the kvstore waits for each lease's commit or release instead
                self.writer_id = 0
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd  # held open: the writer lock lasts as long as this open file
        self.array = np.frombuffer(self._mmap, dtype=np.uint8)

    def close(self) -> None:
        """Unmap and drop the writer lock; while a worker thread still holds a view of the mapping (a
        write that outlived its caller), both stay until the process ends."""
        self.array = None  # type: ignore[assignment]
        try:
            self._mmap.close()
        except BufferError:
            return
        os.close(self._lock_fd)
