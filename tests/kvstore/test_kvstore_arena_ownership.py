"""Who owns an arena file: the kvstore holds an flock on it for its life; a start removes only arenas no
process holds locked (whatever pid their name carries: a container's kvstore is always PID 1). The
engines map an arena only from the configured directory, owned by the kvstore's user, mode 0600."""

from __future__ import annotations

import os

import pytest
from kvstore_testlib import KVStoreProcess

from salon.common.kvstore_contract.arena_mapping import ArenaMapping, ArenaRefused
from salon.kvstore.arena import ARENA_PREFIX, Arena, remove_stale_arenas


def _arenas(directory) -> set[str]:
    return {p.name for p in directory.glob(f"{ARENA_PREFIX}*")}


def test_a_locked_arena_stays_and_an_unlocked_one_goes_whatever_its_pid(tmp_path) -> None:
    live = Arena(str(tmp_path), 1 << 16)
    # The arena of a SIGKILLed kvstore whose successor got the same pid (PID 1 in a container): this
    # test process is alive and has the pid the name carries, but nobody holds the file locked.
    stale = tmp_path / f"{ARENA_PREFIX}{os.getpid()}-deadbeef"
    stale.write_bytes(b"\0" * 4096)
    try:
        assert remove_stale_arenas(str(tmp_path)) == [stale]
        assert _arenas(tmp_path) == {live.path.name}
        assert remove_stale_arenas(str(tmp_path)) == []
    finally:
        live.close()
    assert _arenas(tmp_path) == set()


def test_a_restart_after_sigkill_reclaims_the_arena_and_a_second_store_leaves_a_live_one(tmp_path) -> None:
    procs = [KVStoreProcess(tmp_path, capacity_bytes=1 << 20)]
    try:
        first_arena = _arenas(tmp_path)
        assert len(first_arena) == 1
        procs.append(KVStoreProcess(tmp_path, capacity_bytes=1 << 20))  # same directory, first still running
        both = _arenas(tmp_path)
        assert len(both) == 2 and first_arena < both
        assert procs.pop().stop() == 0
        assert _arenas(tmp_path) == first_arena  # a clean stop removes its own arena
        procs[0].kill()
        assert _arenas(tmp_path) == first_arena  # SIGKILL leaves the file behind...
        (tmp_path / f"{ARENA_PREFIX}1-0badf00d").write_bytes(b"\0" * 4096)  # ...as a PID 1 kvstore would
        procs.append(KVStoreProcess(tmp_path, capacity_bytes=1 << 20))
        remaining = _arenas(tmp_path)
        assert len(remaining) == 1 and not remaining & first_arena  # ...and the next start removes them
        assert procs[-1].stop() == 0
    finally:
        for proc in procs:
            if proc.proc.poll() is None:
                proc.kill()


def _fake_arena(directory, name: str = f"{ARENA_PREFIX}1-feedface", mode: int = 0o600):
    path = directory / name
    path.write_bytes(b"\0" * 4096)
    path.chmod(mode)
    return path


def test_the_engine_maps_only_a_private_arena_inside_its_directory(tmp_path) -> None:
    good = _fake_arena(tmp_path)
    ArenaMapping(str(good), str(tmp_path)).close()
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    cases = {
        "not inside": (str(_fake_arena(other_dir)), str(tmp_path)),
        "not an absolute path": (good.name, str(tmp_path)),
        "not an absolute path to a": (str(_fake_arena(tmp_path, "passwd")), str(tmp_path)),
        "not inside the configured": (str(tmp_path / "other" / ".." / "other" / good.name), str(tmp_path)),
        "mode 0644": (str(_fake_arena(tmp_path, f"{ARENA_PREFIX}2-x", 0o644)), str(tmp_path)),
        "mode 0666": (str(_fake_arena(tmp_path, f"{ARENA_PREFIX}3-x", 0o666)), str(tmp_path)),
    }
    link = tmp_path / f"{ARENA_PREFIX}4-link"
    link.symlink_to(good)
    cases["cannot open it"] = (str(link), str(tmp_path))  # a symlink is never followed
    fifo = tmp_path / f"{ARENA_PREFIX}5-fifo"
    os.mkfifo(fifo, 0o600)
    cases["not a regular file"] = (str(fifo), str(tmp_path))
    for why, (name, directory) in cases.items():
        with pytest.raises(ArenaRefused, match=why):
            ArenaMapping(name, directory)
    # Owned by someone else than the kvstore's user.
    with pytest.raises(ArenaRefused, match="owned by uid"):
        ArenaMapping(str(good), str(tmp_path), owner_uid=os.getuid() + 1)
    if os.getuid() == 0:
        os.chown(good, 4242, -1)
        with pytest.raises(ArenaRefused, match="owned by uid 4242"):
            ArenaMapping(str(good), str(tmp_path))
        ArenaMapping(str(good), str(tmp_path), owner_uid=4242).close()
