"""`salon chat` reading a standard input that is not a terminal (salon.cli.piped_lines.PipedLines): its lines as sent
(CRLF, UTF-8 split between reads, a last line without its newline), and a SIGINT at the prompt always interrupts."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading

import pytest

from salon.cli.piped_lines import PipedLines


def test_lines_as_sent():
    r, w = os.pipe()
    out = io.StringIO()
    lines = PipedLines(r, out)
    data = "ünï\r\nsecond\n\nlast".encode()

    def write():  # byte by byte: a character's bytes arrive in separate reads
        for i in range(len(data)):
            os.write(w, data[i : i + 1])
        os.close(w)

    writer = threading.Thread(target=write)
    writer.start()
    got = [lines.read("You: ") for _ in range(4)]
    with pytest.raises(EOFError):
        lines.read("You: ")
    writer.join()
    os.close(r)
    assert got == ["ünï", "second", "", "last"]
    assert out.getvalue() == "You: " * 5


def test_a_sigint_the_moment_the_prompt_shows_always_interrupts():
    """A program that sends SIGINT as soon as it reads the prompt: with input() in place of PipedLines.read, 9 of 30
    such processes hung (the signal landed before its read() began, which then blocked); each of 100 must end at
    once, interrupted. The child takes Python's own SIGINT handler first, as a process started from a terminal
    has it: started in the background by a shell without job control (as CI may run the suite), it would inherit
    SIGINT ignored."""
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from salon.cli.piped_lines import PipedLines; PipedLines().read('You: ')"
    )
    for _ in range(100):
        child = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        seen = b""
        while b"You: " not in seen:
            chunk = os.read(child.stdout.fileno(), 4096)
            assert chunk, child.stderr.read()
            seen += chunk
        child.send_signal(signal.SIGINT)
        try:
            assert child.wait(10) == -signal.SIGINT, child.stderr.read()
        except subprocess.TimeoutExpired:
            pytest.fail("a SIGINT at the prompt was lost: the wait for the next line went on")
        finally:
            child.kill()
            child.wait()
            child.stdin.close()
            child.stdout.close()
            child.stderr.close()
