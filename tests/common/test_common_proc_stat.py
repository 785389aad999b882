"""/proc/PID/stat read by salon.common.proc_stat: this process's own state, parent and CPU time, against what the
standard library says of it; a pid that does not exist gives None."""

from __future__ import annotations

import os
import time

from salon.common.proc_stat import cpu_seconds, parent_pid, state


def test_this_process_as_the_standard_library_sees_it():
    pid = os.getpid()
    assert state(pid) == "R"  # reading its own stat, it runs
    assert parent_pid(pid) == os.getppid()
    before = cpu_seconds(pid)
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    spent = cpu_seconds(pid) - before
    assert 0.25 <= spent <= 0.3 + 0.25, spent  # ticks of 10 ms; other threads of the test process may add some


def test_a_pid_that_does_not_exist_gives_none():
    gone = 2**22 + 1  # above Linux's largest pid
    assert state(gone) is None and parent_pid(gone) is None and cpu_seconds(gone) is None
