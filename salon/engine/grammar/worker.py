"""Processes that compile constraints for one vocabulary, at a lower CPU priority, killed when a compilation
outlives its time limit.

    WorkerSpawner(vocabulary, stop_token_ids, nice)   starts `python -m salon.engine.grammar.worker_main`: it
                                                      lowers its priority by `nice` first, imports xgrammar and builds
                                                      the tokenizer info once (seconds: xgrammar imports torch)
    spawn(timeout_s)                                  a CompileWorker forked from it (milliseconds), talking over
                                                      a socket pair of its own; SpawnerNotReady while it starts
    CompileWorker.compile(constraint, cpu_s, wait_s)  the compiled grammar as xgrammar's JSON, or InvalidArgument
                                                      (does not compile: the compiler's reason), or, after killing
                                                      the worker, CompileTimedOut (it used cpu_s of CPU time) or
                                                      CompileStarved (wait_s passed first)
    CompileWorker.pause() / resume()                  SIGSTOP / SIGCONT: the engine stops its workers while the
                                                      model computes (compiler.py)

A killed worker is replaced by a fork, so a stream of too-slow constraints costs each one its time limit, not a
fresh interpreter. Blocking calls: the grammar compiler calls them on its own threads, one worker per thread.
A compiled grammar comes back as xgrammar's serialized JSON, which the caller deserializes against its own
tokenizer info (a few per cent of the compilation's time, with the GIL released). Workers are the spawner's
children (it reaps them); when the engine ends, their sockets close and they exit.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle

from salon.common.errors import InvalidArgument, Unavailable
from salon.common.proc_stat import cpu_seconds
from salon.engine.grammar.constraint import Constraint

# The spawner imports xgrammar (and torch) and builds its tokenizer info: seconds, not minutes.
START_TIMEOUT_S = 120.0


class CompileTimedOut(Exception):
    """The compilation outlived its time limit; its worker was killed."""


class CompileStarved(Exception):
    """The compilation did not get its CPU time within its wait (its worker paused, or the host busy); the worker
    was killed."""


class SpawnerNotReady(Exception):
    """The spawner is still starting (importing xgrammar, building its tokenizer info)."""


# How often a compilation's CPU time is read while it runs.
POLL_S = 0.02


class CompileWorker:
    def __init__(self, pid: int, conn: Connection) -> None:
        self.pid = pid
        self._conn = conn
        self.alive = True  # until killed, or found gone
        self.compiles = 0  # constraints handed to this worker
        self.paused = False

    def compile(self, constraint: Constraint, cpu_s: float, wait_s: float) -> str:
        """Compile within cpu_s of the worker's CPU time (where /proc is missing, of wall time) and wait_s of wall
        time: a paused worker's clock stands still, so a constraint is judged by its own cost, not the host's load."""
        self.compiles += 1
        start = time.monotonic()
        used_before = cpu_seconds(self.pid)
        try:
            self._conn.send(constraint)
            while True:
                waited = time.monotonic() - start
                if self._conn.poll(max(0.0, min(POLL_S, wait_s - waited))):
                    ok, payload = self._conn.recv()
                    if ok:
                        return payload
                    raise InvalidArgument(payload)
                now = cpu_seconds(self.pid)
                used = time.monotonic() - start if now is None or used_before is None else now - used_before
                if used >= cpu_s:
                    self.kill()
                    raise CompileTimedOut
                if time.monotonic() - start >= wait_s:
                    self.kill()
                    raise CompileStarved
        except (EOFError, OSError):
            # The worker died on this constraint (xgrammar crashes on some grammars, e.g. `root ::= root{2}`):
            # the constraint is refused, and remembered like any other that does not compile.
            self.kill()
            raise InvalidArgument(
                f"{constraint.kind.value}: does not compile (the grammar compiler crashed on it)"
            ) from None

    def pause(self) -> None:
        self._signal(signal.SIGSTOP, True)

    def resume(self) -> None:
        self._signal(signal.SIGCONT, False)

    def _signal(self, signum: int, paused: bool) -> None:
        if self.alive and self.paused != paused:
            self.paused = paused
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL (a stopped process too). The pid is still this worker's: it exits only when its socket closes,
        which happens here."""
        if self.alive:
            self.alive = False
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._conn.close()


class WorkerSpawner:
    def __init__(self, vocabulary: Sequence[bytes], stop_token_ids: Sequence[int], nice: int) -> None:
        parent, child = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "salon.engine.grammar.worker_main", str(child.fileno()), str(nice)],
            pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self._conn = Connection(parent.detach())
        self._lock = threading.Lock()
        # The vocabulary fills the socket's buffer until the process reads it, after its imports: sent from a
        # thread of its own, so the engine's start does not wait for it.
        self._sender = threading.Thread(
            target=self._send_quietly, args=((list(vocabulary), list(stop_token_ids)),), daemon=True
        )
        self._sender.start()
        self._ready = False
        self._started = time.monotonic()

    def _send_quietly(self, message: object) -> None:
        try:
            self._conn.send(message)
        except OSError:  # killed before it read it
            pass

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def _wait_ready(self, timeout_s: float) -> None:
        if self._ready:
            return
        if not self._conn.poll(max(0.0, min(timeout_s, self._started + START_TIMEOUT_S - time.monotonic()))):
            if time.monotonic() < self._started + START_TIMEOUT_S:
                raise SpawnerNotReady
            self.kill()
            raise Unavailable(f"the grammar compile workers did not start within {START_TIMEOUT_S:g} s")
        self._conn.recv()
        self._ready = True

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the spawner is ready; SpawnerNotReady after timeout_s."""
        with self._lock:
            self._wait_ready(timeout_s)

    def spawn(self, timeout_s: float) -> CompileWorker:
        """A worker; SpawnerNotReady when the spawner is not ready within timeout_s."""
        ours, theirs = socket.socketpair()
        with self._lock:
            try:
                self._wait_ready(timeout_s)
                self._conn.send("fork")
                send_handle(self._conn, theirs.fileno(), self.process.pid)
                pid = self._conn.recv()
            except (EOFError, OSError):
                ours.close()
                self.kill()
                raise Unavailable("the grammar compile workers' spawner exited") from None
            except SpawnerNotReady:
                ours.close()
                raise
            finally:
                theirs.close()
        return CompileWorker(pid, Connection(ours.detach()))

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._sender.join()  # its write fails once the process is gone
        self._conn.close()
