"""`salon up`'s own directories: the state directory (logs, certificates, secrets, pid files) and the
tmpfs directory of the kvstore's arena, each owned by this user and closed to everyone else (0700).

    state dir   made 0700; an existing one of ours is set to 0700; another user's is refused
    shm dir     default: made fresh under /dev/shm with an unpredictable name (mkdtemp, 0700), so no
                other user can have made it first; --shm-dir: made 0700 if missing, else it must already
                be a directory (not a link) of ours with mode 0700

A refused directory is a PrivateDirError, one line saying what is wrong and how to fix it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

SHM_ROOT = Path("/dev/shm")


class PrivateDirError(RuntimeError):
    """A directory salon up would use is another user's, or open to others."""


def private_state_dir(path: Path) -> Path:
    """Make `path` (and missing parents) and set it to 0700; refuse one owned by another user."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise PrivateDirError(f"state directory {path} belongs to uid {info.st_uid}, not to you: choose another")
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)
    return path


def checked_shm_dir(path: Path) -> Path:
    """`path`, made 0700 if missing; an existing one must be our own directory with mode 0700."""
    try:
        path.mkdir(mode=0o700, parents=True)
        path.chmod(0o700)  # mkdir's mode passes through the umask
        return path
    except FileExistsError:
        pass
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise PrivateDirError(f"shm directory {path} is not a directory (a link or a file): choose another")
    if info.st_uid != os.getuid():
        raise PrivateDirError(f"shm directory {path} belongs to uid {info.st_uid}, not to you: choose another")
    mode = stat.S_IMODE(info.st_mode)
    if mode != 0o700:
        raise PrivateDirError(
            f"shm directory {path} has mode {mode:04o}, not 0700: `chmod 700 {path}` or choose another"
        )
    return path


def fresh_shm_dir(state_dir: Path) -> Path:
    """A new 0700 directory under /dev/shm with an unpredictable name (state_dir/shm where there is none)."""
    if not SHM_ROOT.is_dir():
        return checked_shm_dir(state_dir / "shm")
    return Path(tempfile.mkdtemp(prefix=f"salon-{os.getuid()}-", dir=SHM_ROOT))
