"""The compile workers' spawner (worker.py starts it): lowers its priority by the nice value on its command line
before it imports anything heavy (the compiler's imports take seconds of CPU: torch), reads the vocabulary and its
stop tokens, builds its compiler, says "ready"; then for each "fork" and the socket that comes with it,
forks a worker (its pid sent back; it dies with the spawner) that answers each constraint with (True, the
compiled grammar as xgrammar's JSON) or (False, why it does not compile) until its socket closes. The spawner
ends when its own socket does."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from salon.engine.grammar.compiler import GrammarCompiler

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL when the spawner ends (Linux): a worker the engine paused (SIGSTOP) would never see its socket
    close."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def lower_priority(nice: int) -> None:
    """Nice by `nice`, and Linux's idle class besides: a worker runs only on a core nothing else wants, and a
    waking step thread takes its core at once (nice alone still lets it delay each wake-up of the model's
    threads)."""
    if not nice:
        return
    os.nice(nice)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def serve(conn: Connection, compiler: GrammarCompiler) -> None:
    from salon.common.errors import InvalidArgument

    while True:
        try:
            constraint = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, compiler.compile_now(constraint).serialize_json()))
        except InvalidArgument as exc:
            conn.send((False, exc.message))


def main(fd: int, nice: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine's Ctrl-C is the engine's; it closes the socket
    lower_priority(nice)
    from salon.engine.grammar.compiler import GrammarCompiler, GrammarLimits

    control = Connection(fd)
    vocabulary, stop_token_ids = control.recv()
    compiler = GrammarCompiler(vocabulary, tuple(stop_token_ids), GrammarLimits(compile_workers=0))
    compiler.ready()
    compiler.close(wait=True)  # its pool's thread ends: the forks below come from a single-threaded process
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped as they end
    control.send("ready")
    spawner = os.getpid()
    while True:
        try:
            control.recv()
            worker_fd = recv_handle(control)
        except EOFError:
            return
        pid = os.fork()
        if pid == 0:
            die_with_parent()
            if os.getppid() != spawner:  # the spawner ended before the line above
                os._exit(0)
            control.close()
            try:
                serve(Connection(worker_fd), compiler)
            finally:
                os._exit(0)
        os.close(worker_fd)
        control.send(pid)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
