"""A process's line of /proc/PID/stat (Linux): its state, its parent, its CPU time. Each is None where /proc cannot
tell (another OS, or the process gone)."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _fields(pid: int) -> list[str] | None:
    """The fields after the command name (which may hold spaces and parentheses): state, ppid, ..."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of the process so far (10 ms ticks on most kernels)."""
    fields = _fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def state(pid: int) -> str | None:
    """R (running), S (sleeping), T (stopped), Z (zombie), ..."""
    fields = _fields(pid)
    return None if fields is None else fields[0]


def parent_pid(pid: int) -> int | None:
    fields = _fields(pid)
    return None if fields is None else int(fields[1])
