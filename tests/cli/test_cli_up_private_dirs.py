"""`salon up`'s directories are its own: the state directory 0700 (another user's refused), service logs
0600, the kvstore's shm directory fresh under an unpredictable name or, when given, checked (ours, 0700)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from test_cli_up_chat import SALON, up_args

from salon.cli.private_dirs import (
    SHM_ROOT,
    PrivateDirError,
    checked_shm_dir,
    fresh_shm_dir,
    private_state_dir,
)
from salon.cli.up import build_parser, plan_stack
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _another_users_dir(tmp_path: Path) -> Path:
    """A directory of another user, mode 0700: made and given away as root, else root's /dev/shm."""
    if os.getuid() != 0:
        return SHM_ROOT
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 4242, 4242)
    return path


def test_the_state_dir_is_made_0700_and_an_open_one_of_ours_is_closed(tmp_path):
    old_umask = os.umask(0o022)
    try:
        made = private_state_dir(tmp_path / "a" / "state")
        assert _mode(made) == 0o700
        existing = tmp_path / "existing"
        existing.mkdir(mode=0o755)
        assert _mode(existing) == 0o755
        private_state_dir(existing)
        assert _mode(existing) == 0o700
    finally:
        os.umask(old_umask)


def test_another_users_state_dir_is_refused(tmp_path):
    theirs = _another_users_dir(tmp_path)
    before = _mode(theirs)
    with pytest.raises(PrivateDirError, match=f"state directory {theirs} belongs to uid {theirs.stat().st_uid}"):
        private_state_dir(theirs)
    assert _mode(theirs) == before  # left as it was


def test_the_default_shm_dir_is_fresh_private_and_unpredictable(tmp_path):
    first, second = fresh_shm_dir(tmp_path), fresh_shm_dir(tmp_path)
    try:
        assert first != second and first.parent == second.parent == SHM_ROOT
        for path in (first, second):
            info = path.lstat()
            assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and _mode(path) == 0o700
            assert path.name.startswith(f"salon-{os.getuid()}-") and len(path.name) > len(f"salon-{os.getuid()}-") + 6
    finally:
        first.rmdir()
        second.rmdir()


def test_a_given_shm_dir_is_made_0700_or_must_be_ours_and_0700(tmp_path):
    old_umask = os.umask(0o022)
    try:
        made = checked_shm_dir(tmp_path / "new" / "shm")
        assert _mode(made) == 0o700
        assert checked_shm_dir(made) == made  # ours and 0700: used as it is
    finally:
        os.umask(old_umask)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(PrivateDirError, match=f"shm directory {open_dir} has mode 0777, not 0700"):
        checked_shm_dir(open_dir)
    assert _mode(open_dir) == 0o777  # not silently changed: something may already be inside
    link = tmp_path / "link"
    link.symlink_to(made)
    with pytest.raises(PrivateDirError, match="not a directory"):
        checked_shm_dir(link)
    theirs = _another_users_dir(tmp_path)
    with pytest.raises(PrivateDirError, match=f"belongs to uid {theirs.stat().st_uid}"):
        checked_shm_dir(theirs)


def test_plan_stack_hands_the_kvstore_and_engines_the_checked_dir(tmp_path):
    shm = tmp_path / "shm"
    args = build_parser().parse_args(["--state-dir", str(tmp_path / "state"), "--shm-dir", str(shm)])
    children = plan_stack(args)
    assert _mode(shm) == 0o700 and _mode(tmp_path / "state") == 0o700
    kvstore, *engines, _gateway = children
    assert kvstore.args[kvstore.args.index("--shm-dir") + 1] == str(shm)
    for engine in engines:
        assert engine.args[engine.args.index("--kvstore-shm-dir") + 1] == str(shm)


def test_salon_up_refuses_an_open_shm_dir_before_starting_anything(tmp_path):
    open_dir = tmp_path / "shm"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    _gw, args = up_args(tmp_path)
    result = subprocess.run([*SALON, *args, "--shm-dir", str(open_dir)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        f"salon up: shm directory {open_dir} has mode 0777, not 0700: `chmod 700 {open_dir}` or choose another"
    ]
    state = Path(args[args.index("--state-dir") + 1])
    assert not (state / "kvstore.log").exists()  # no child was started


def test_service_logs_are_0600_even_when_the_file_was_there(tmp_path):
    log = tmp_path / "kvstore.log"
    log.write_text("")
    log.chmod(0o644)
    shm = checked_shm_dir(tmp_path / "shm")
    flags = ["--port", "0", "--shm-dir", str(shm), "--capacity-bytes", str(1 << 20), *INSECURE_LOOPBACK_FLAGS]
    proc = start_service("kvstore", flags, log_path=log, wait_serving=False)
    try:
        assert _mode(log) == 0o600
        fresh = tmp_path / "fresh.log"
        proc2 = start_service("kvstore", flags, log_path=fresh, wait_serving=False)
        proc2.stop()
        assert _mode(fresh) == 0o600
    finally:
        proc.stop()
