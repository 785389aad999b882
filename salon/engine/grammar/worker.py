"""A process that compiles constraints for one vocabulary, at a lower CPU priority, killed when a compilation
outlives its time limit.

    CompileWorker(vocabulary, stop_token_ids, nice)   starts `python -m salon.engine.grammar.worker` with one
                                                      end of a socket pair; it builds its own xgrammar compiler
                                                      and lowers its priority by `nice`
    compile(constraint, timeout_s)                    the compiled grammar as xgrammar's JSON, or InvalidArgument
                                                      (does not compile: the compiler's reason), or
                                                      CompileTimedOut after killing the process

Blocking calls: the grammar compiler calls them on its own threads, one worker per thread. A compiled grammar
comes back as xgrammar's serialized JSON, which the caller deserializes against its own tokenizer info (a few
per cent of the compilation's time, with the GIL released). A killed worker is replaced by a fresh one; the
compile time limit starts when the worker has the constraint, not while it starts.
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

from salon.common.errors import InvalidArgument, Unavailable
from salon.engine.grammar.constraint import Constraint

# A fresh worker imports xgrammar (and torch) and builds its tokenizer info: seconds, not minutes.
START_TIMEOUT_S = 120.0


class CompileTimedOut(Exception):
    """The compilation outlived its time limit; its worker was killed."""


class CompileWorker:
    def __init__(self, vocabulary: Sequence[bytes], stop_token_ids: Sequence[int], nice: int) -> None:
        parent, child = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "salon.engine.grammar.worker", str(child.fileno())],
            pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self._conn = Connection(parent.detach())
        # The vocabulary fills the socket's buffer until the process reads it, after its imports: sent from a
        # thread of its own, so a replacement worker starts without holding up its caller.
        self._sender = threading.Thread(
            target=self._send_quietly, args=((list(vocabulary), list(stop_token_ids), nice),), daemon=True
        )
        self._sender.start()
        self._ready = False
        self.compiles = 0  # constraints handed to this worker (tests count them)

    def _send_quietly(self, message: object) -> None:
        try:
            self._conn.send(message)
        except OSError:  # killed before it read it
            pass

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_ready(self) -> None:
        if self._ready:
            return
        if not self._conn.poll(START_TIMEOUT_S):
            self.kill()
            raise Unavailable(f"the grammar compile worker did not start within {START_TIMEOUT_S:g} s")
        try:
            self._conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise Unavailable("the grammar compile worker exited while starting") from None
        self._ready = True

    def compile(self, constraint: Constraint, timeout_s: float) -> str:
        self._wait_ready()
        self.compiles += 1
        try:
            self._conn.send(constraint)
            deadline = time.monotonic() + timeout_s
            if self._conn.poll(max(0.0, deadline - time.monotonic())):
                ok, payload = self._conn.recv()
                if ok:
                    return payload
                raise InvalidArgument(payload)
        except (EOFError, OSError):
            self.kill()
            raise Unavailable("the grammar compile worker exited while compiling") from None
        self.kill()
        raise CompileTimedOut

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._sender.join()  # its write fails once the process is gone
        self._conn.close()


def main(fd: int) -> None:
    from salon.engine.grammar.compiler import GrammarCompiler, GrammarLimits

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine's Ctrl-C is the engine's; it closes the socket
    conn = Connection(fd)
    vocabulary, stop_token_ids, nice = conn.recv()
    if nice:
        os.nice(nice)
    compiler = GrammarCompiler(vocabulary, tuple(stop_token_ids), GrammarLimits(compile_workers=0))
    compiler.ready()
    conn.send("ready")
    while True:
        try:
            constraint = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, compiler.compile_now(constraint).serialize_json()))
        except InvalidArgument as exc:
            conn.send((False, exc.message))


if __name__ == "__main__":
    main(int(sys.argv[1]))
