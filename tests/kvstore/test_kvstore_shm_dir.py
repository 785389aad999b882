"""The kvstore's shared-memory directory must be its own: owned by its user, mode 0700; a missing one is
created so; anything else stops the start with an error naming the directory (exit status 2)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from kvstore_testlib import REPO_ROOT, KVStoreProcess

from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS, SecurityConfigError
from salon.kvstore.arena import ARENA_PREFIX
from salon.kvstore.shm_dir import check_shm_dir


def _foreign_dir(tmp_path: Path) -> tuple[Path, int]:
    """A directory another uid owns, mode 0700: made and given away as root, else the root directory."""
    if os.geteuid() == 0:
        path = tmp_path / "theirs"
        path.mkdir(mode=0o700)
        os.chown(path, 4242, 4242)
        return path, 4242
    return Path("/"), os.stat("/").st_uid


def test_the_directory_must_be_this_users_and_closed_to_others(tmp_path) -> None:
    created = tmp_path / "new"
    check_shm_dir(str(created))  # missing: created 0700
    assert stat.S_IMODE(created.stat().st_mode) == 0o700 and created.stat().st_uid == os.geteuid()
    check_shm_dir(str(created))  # and accepted again
    for mode in (0o777, 0o1777, 0o750, 0o701):
        path = tmp_path / f"open-{mode:o}"
        path.mkdir()
        path.chmod(mode)
        with pytest.raises(SecurityConfigError) as info:
            check_shm_dir(str(path))
        assert str(info.value) == (
            f"--shm-dir {path}: mode {mode:04o} lets group or others in; it must be 0700 (chmod 0700 {path})"
        )
    foreign, uid = _foreign_dir(tmp_path)
    with pytest.raises(SecurityConfigError, match=f"--shm-dir {foreign}: owned by uid {uid}, not the kvstore's uid"):
        check_shm_dir(str(foreign))
    link = tmp_path / "link"
    link.symlink_to(created)
    with pytest.raises(SecurityConfigError, match=f"--shm-dir {link}: not a directory reached without a symlink"):
        check_shm_dir(str(link))
    with pytest.raises(SecurityConfigError, match="cannot create it"):
        check_shm_dir(str(tmp_path / "missing-parent" / "shm"))


def _start(shm_dir: Path) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "salon.kvstore", "--port", "0", "--capacity-bytes", "65536"]
    args += ["--shm-dir", str(shm_dir), *INSECURE_LOOPBACK_FLAGS]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_the_kvstore_refuses_to_start_in_a_shared_or_foreign_directory(tmp_path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    result = _start(shared)
    assert result.returncode == 2 and "LISTENING" not in result.stdout
    assert f"kvstore: --shm-dir {shared}: mode 0777 lets group or others in" in result.stderr
    assert list(shared.iterdir()) == []  # no arena was made there
    foreign, uid = _foreign_dir(tmp_path)
    result = _start(foreign)
    assert result.returncode == 2 and "LISTENING" not in result.stdout
    assert f"kvstore: --shm-dir {foreign}: owned by uid {uid}" in result.stderr
    # Positive control: a private directory (created on start) serves.
    private = tmp_path / "private"
    proc = KVStoreProcess(private, capacity_bytes=1 << 16)
    try:
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert [p.name.startswith(ARENA_PREFIX) for p in private.iterdir()] == [True]
    finally:
        assert proc.stop() == 0
