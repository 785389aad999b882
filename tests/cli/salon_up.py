"""`salon up` as the README runs it, for the tests of the newcomer's path: every default but the state
directory (the test's own, so a developer's stack in ~/.cache/salon is left alone), the banner read up to its
last line, then Ctrl-C, as the banner says, and a clean exit that prints "stopping..." and nothing else."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from test_cli_up_chat import SALON

BANNER_END = "Ctrl-C stops everything"


@contextlib.contextmanager
def salon_up(state_dir: Path) -> Iterator[list[str]]:
    """The banner's lines of a running `salon up`; on leaving, SIGINT, then exit status 0 and a console that shows
    only "stopping..." after the banner are asserted (unless the body raised)."""
    up = subprocess.Popen(
        [*SALON, "up", "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    errors: list[str] = []
    stderr = threading.Thread(target=lambda: errors.extend(up.stderr), daemon=True)
    stderr.start()
    try:
        banner: list[str] = []
        deadline = time.monotonic() + 600
        while not banner or BANNER_END not in banner[-1]:
            line = up.stdout.readline()
            assert line or up.poll() is None, "".join(errors)
            assert time.monotonic() < deadline, banner
            banner.append(line)
        errors_before = len(errors)  # what stderr showed while the stack came up
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.extend(up.stdout), daemon=True)
        reader.start()
        yield banner
    finally:
        up.send_signal(signal.SIGINT)
        try:
            code = up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait(10)
            raise
    assert code == 0, "".join(errors)
    reader.join(10)
    stderr.join(10)
    # (a stopping service's GOAWAY reaching an open health-probe channel was once logged here by gRPC's core)
    assert rest == ["stopping...\n"] and errors[errors_before:] == [], (rest, errors[errors_before:])
