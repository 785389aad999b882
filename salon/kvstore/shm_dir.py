"""The kvstore's shared-memory directory must be its own: owned by its user, closed to everyone else.

The arena file is 0600, but the directory around it decides who can create, replace or pre-empt names
in it: in a shared directory (/dev/shm is root's and 1777) another user can plant files next to the
arena or squat the paths engines are told to map. So at start the directory must be owned by the
kvstore's effective uid, and its mode must grant nothing to group or others (0700); a directory that
does not exist yet is created that way (its parent must exist). Anything else is a start-up error
naming the directory.
"""

from __future__ import annotations

import os
import stat

from salon.common.internal_auth import SecurityConfigError


def check_shm_dir(path: str) -> None:
    """SecurityConfigError unless `path` is a directory of this user with mode 0700 (or less)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SecurityConfigError(f"--shm-dir {path}: cannot create it ({exc.strerror})") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SecurityConfigError(
            f"--shm-dir {path}: not a directory reached without a symlink ({exc.strerror})"
        ) from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    uid = os.geteuid()
    if st.st_uid != uid:
        raise SecurityConfigError(
            f"--shm-dir {path}: owned by uid {st.st_uid}, not the kvstore's uid {uid}; "
            f"give the kvstore a directory of its own (mkdir -m 0700 DIR)"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise SecurityConfigError(
            f"--shm-dir {path}: mode {mode:04o} lets group or others in; it must be 0700 (chmod 0700 {path})"
        )
