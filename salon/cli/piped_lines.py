"""The lines of a standard input that is not a terminal (a program drives `salon chat`), each read after its prompt
so that a SIGINT at the prompt always interrupts (input() can miss one: see PipedLines)."""

from __future__ import annotations

import os
import select
import signal
import sys


class PipedLines:
    """Lines of a standard input that is not a terminal (a program drives the chat), each after its prompt, read
    so that a SIGINT at the prompt always interrupts: the wait is a select() beside a signal wake-up fd, set before
    the prompt is written, so a signal that lands between the prompt and the wait wakes it (with input(), one that
    landed just before its read() only set Python's flag, and the read then blocked). Bytes are read as they come
    and split here (a buffered reader may hold the next lines where select() cannot see them). Main thread only
    (where Python runs its signal handlers)."""

    def __init__(self, fd: int = 0, out=None) -> None:
        self.fd, self.out, self.pending, self.ended = fd, sys.stdout if out is None else out, b"", False

    def read(self, prompt: str) -> str:
        """The next line (its newline removed); EOFError at the input's end."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        before = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            self.out.write(prompt)
            self.out.flush()
            while b"\n" not in self.pending and not self.ended:
                ready = select.select([self.fd, wake_r], [], [])[0]  # SIGINT: KeyboardInterrupt from here
                if wake_r in ready:  # another signal's byte
                    os.read(wake_r, 4096)
                if self.fd in ready:
                    chunk = os.read(self.fd, 65536)
                    self.pending += chunk
                    self.ended = not chunk
        finally:
            signal.set_wakeup_fd(before)
            os.close(wake_r)
            os.close(wake_w)
        if not self.pending:
            raise EOFError
        line, _, self.pending = self.pending.partition(b"\n")
        return line.removesuffix(b"\r").decode(errors="replace")
