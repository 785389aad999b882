"""Writer locks: how the kvstore knows that a process which may write into its arena is gone.

An engine writes put blocks straight into the shared arena, so a writer that stalled past its lease
(SIGSTOP, a descheduled thread) could still write later, and the kvstore must not hand that space to
another block until the writer is provably done with it. One proof is the writer's end: each engine
mapping holds an open-file-description lock (F_OFD_SETLK) on one byte of the arena file far past its
end, at WRITER_LOCK_BASE + writer_id, for as long as it can write through the mapping. The kernel drops
the lock when the last descriptor of that open file goes, which is when the process ends however it
ends (forked children share it, as they share the mapping). The kvstore asks F_OFD_GETLK whether
anyone still holds it. The locks are advisory and never touch the arena's bytes; the kvstore's own
`flock` on the file (arena ownership) is a different lock and does not interact with them.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import struct

# Far past any arena (byte offsets up to 2**62 are plenty) and below the largest off_t.
WRITER_LOCK_BASE = 1 << 62
MAX_WRITER_ID = (1 << 48) - 1

# struct flock on Linux (x86-64 and aarch64): short l_type, short l_whence, off_t l_start, off_t l_len,
# pid_t l_pid, padded to 32 bytes.
_FLOCK = struct.Struct("@hhqqi4x")


def _flock(lock_type: int, writer_id: int) -> bytes:
    return _FLOCK.pack(lock_type, os.SEEK_SET, WRITER_LOCK_BASE + writer_id, 1, 0)


def take_writer_lock(fd: int) -> int:
    """Lock a fresh writer id on the arena open as `fd` (read-write) and return it; the lock lasts
    while that open file does. OSError if locks are not supported there."""
    for _ in range(8):
        writer_id = secrets.randbelow(MAX_WRITER_ID) + 1
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, writer_id))
        except (BlockingIOError, PermissionError):  # held by another writer: draw again
            continue
        return writer_id
    raise OSError("no free writer id on the arena")


def writer_lock_held(fd: int, writer_id: int) -> bool:
    """True if some open file (another process's, normally) holds writer lock `writer_id` on the file
    open as `fd`. Locks held through `fd` itself do not count."""
    if not 0 < writer_id <= MAX_WRITER_ID:
        return False
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock(fcntl.F_WRLCK, writer_id))
    return _FLOCK.unpack(answer)[0] != fcntl.F_UNLCK
