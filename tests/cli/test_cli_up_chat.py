"""`salon up` starts the three services as processes and stops them; `salon chat` streams replies
through it and shows the cross-turn cache at work from the second turn on."""

import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.ports import free_port_spans

SALON = [sys.executable, "-m", "salon.cli.main"]


def free_ports(n, engines=1):
    """Ports for `salon up`'s flags, in this order: gateway, kvstore, engine base, metrics base, HTTP (the first n).
    Each is free together with what `salon up` derives from it (engine base + i; metrics base + 1 for the kvstore,
    + 2 + i for engine i), and none overlaps another (tests/ports.py: below the kernel's ephemeral ports, so that
    the stack's health ports and connections cannot take one while it starts)."""
    return free_port_spans([1, 1, engines, 2 + engines, 1][:n])


def up_args(tmp_path):
    """Every port free and explicit (the HTTP API's too), so that these stacks run beside each other."""
    gw, kv, eng, metrics, http = free_ports(5)
    return gw, [
        "up",
        "--model",
        "synthetic-tiny",
        "--gateway-port",
        str(gw),
        "--kvstore-port",
        str(kv),
        "--engine-base-port",
        str(eng),
        "--metrics-base-port",
        str(metrics),
        "--http-port",
        str(http),
        "--state-dir",
        str(tmp_path),
        "--api-key",
        "cli-test-key",
    ]


def test_up_reports_where_everything_listens_and_exits_cleanly(tmp_path):
    _gw, args = up_args(tmp_path)
    result = subprocess.run([*SALON, *args, "--exit-when-serving"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    for name in ("kvstore", "engine-0", "gateway"):
        assert re.search(rf"{name}\s+127\.0\.0\.1:\d+\s+pid \d+", result.stdout), result.stdout
    assert "mutual TLS between services" in result.stdout
    http = args[args.index("--http-port") + 1]
    assert re.search(rf"^  http\s+http://127\.0\.0\.1:{http}/v1 ", result.stdout, re.M), result.stdout
    curl = f"curl http://127.0.0.1:{http}/v1/models -H 'Authorization: Bearer cli-test-key'"
    assert re.search(rf"^try it:\s+{re.escape(curl)}$", result.stdout, re.M), result.stdout
    assert {"kvstore.log", "engine-0.log", "gateway.log", "tenants.json", "tls"} <= {
        p.name for p in Path(tmp_path).iterdir()
    }
    tls = Path(tmp_path) / "tls"
    assert {"ca.pem", "gateway.pem", "engine.pem", "kvstore.pem", "namespace-grant.key", "salt-secret.key"} <= {
        p.name for p in tls.iterdir()
    }
    assert tls.stat().st_mode & 0o777 == 0o700 and (tls / "engine.key").stat().st_mode & 0o777 == 0o600


def test_chat_streams_and_the_second_turn_hits_the_cache(tmp_path):
    gw, args = up_args(tmp_path)
    up = subprocess.Popen(
        [*SALON, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        line = ""
        while "Ctrl-C stops everything" not in line:
            line = up.stdout.readline()
            assert line or up.poll() is None, up.stderr.read()
            assert time.monotonic() < deadline
        chat = subprocess.run(
            [*SALON, "chat", "--target", f"127.0.0.1:{gw}", "--api-key", "cli-test-key", "--max-new-tokens", "8"],
            input="Tell me about the harbour.\nAnd the lighthouse?\n  /quit \nNever sent.\n",
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert chat.returncode == 0, chat.stderr
        usages = re.findall(r"\[(\d+) prompt tokens, (\d+) cached, (\d+) generated", chat.stdout)
        assert len(usages) == 2, chat.stdout  # /quit quit: the line after it was never sent
        (p1, c1, g1), (p2, c2, _g2) = [tuple(map(int, u)) for u in usages]
        assert c1 == 0 and g1 == 8
        # Turn 1's prompt and reply, less the never-computed last token.
        assert c2 == p1 + g1 - 1 and p2 > p1
    finally:
        # SIGHUP (the terminal went away) stops the stack as Ctrl-C does: cleanly, every child with it.
        children = [
            int((Path(tmp_path) / f"{n}.pid").read_text())
            for n in ("kvstore", "engine-0", "gateway")
            if (Path(tmp_path) / f"{n}.pid").exists()
        ]
        up.send_signal(signal.SIGHUP)
        assert up.wait(60) == 0
        assert children and not [
            p
            for p in children
            if Path(f"/proc/{p}").exists() and "zombie" not in Path(f"/proc/{p}/status").read_text().lower()
        ]


def _read_until(stream_fd: int, seen: list[str], pattern: str, timeout_s: float = 120) -> re.Match:
    """Read the chat's stdout (a pipe, unbuffered) until `pattern` matches all of it so far."""
    deadline = time.monotonic() + timeout_s
    while (match := re.search(pattern, "".join(seen), re.S)) is None:
        assert time.monotonic() < deadline, "".join(seen)
        ready, _, _ = select.select([stream_fd], [], [], 0.5)
        if ready:
            chunk = os.read(stream_fd, 65536).decode(errors="replace")
            assert chunk, "".join(seen)  # (the chat exited)
            seen.append(chunk)
    return match


def _metric(metrics_port: int, name: str, labels: str = r"[^}]*") -> float | None:
    """The sum of a series' samples whose labels match `labels` on a /metrics page; None where it has none."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    samples = re.findall(rf"^{re.escape(name)}\{{{labels}\}} (\S+)$", body, re.M)
    return sum(map(float, samples)) if samples else None


def test_ctrl_c_stops_a_reply_and_the_dialogue_goes_on(tmp_path):
    """Ctrl-C while a reply streams cancels it (the engine aborts it: nothing runs after), the partial reply stays in
    the dialogue (the next turn's prompt holds it, cached), and Ctrl-C at the prompt quits with status 0."""
    gw, args = up_args(tmp_path)
    up = subprocess.Popen(
        [*SALON, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    chat = None
    try:
        banner = ""
        while "Ctrl-C stops everything" not in banner:
            line = up.stdout.readline()
            assert line or up.poll() is None, up.stderr.read()
            banner += line
        engine_metrics = int(re.search(r"engine-0 .* metrics http://127\.0\.0\.1:(\d+)/metrics", banner).group(1))
        chat = subprocess.Popen(
            [*SALON, "chat", "--target", f"127.0.0.1:{gw}", "--api-key", "cli-test-key", "--max-new-tokens", "1500"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        fd = chat.stdout.fileno()
        seen: list[str] = []
        _read_until(fd, seen, r"Ctrl-C stops a reply")
        chat.stdin.write(b"Tell me everything about the harbour.\n")
        chat.stdin.flush()
        _read_until(fd, seen, r"Ada: .{1500}")  # the reply is streaming: a few hundred tokens
        chat.send_signal(signal.SIGINT)
        kept = int(_read_until(fd, seen, r"\[stopped after (\d+) tokens\]\nYou: ").group(1))
        assert "prompt tokens" not in "".join(seen)  # it ended before its usage line
        # the cancelled call aborted the engine's request (not its budget: that would count as length), and
        # nothing runs after
        deadline = time.monotonic() + 30
        while (
            _metric(engine_metrics, "vllm:request_success_total", r'[^}]*finished_reason="abort"[^}]*') or 0
        ) < 1 or _metric(engine_metrics, "vllm:num_requests_running") != 0:
            assert time.monotonic() < deadline, "the engine did not abort the stopped reply"
            time.sleep(0.1)
        chat.stdin.write(b"And the lighthouse?\n")
        chat.stdin.flush()
        usage = _read_until(fd, seen, r"\[(\d+) prompt tokens, (\d+) cached, (\d+) generated[^\]]*\]\nYou: ")
        prompt, cached, generated = map(int, usage.groups())
        # the stopped reply is in the dialogue, and its KV is reused: turn 1's prompt is far shorter than the
        # reply's hundreds of tokens, so without them the cache could not hold this many
        assert generated > 0 and prompt > kept and cached >= kept > 150, (prompt, cached, kept)
        chat.send_signal(signal.SIGINT)  # at the prompt (the moment it shows): quit
        assert chat.wait(30) == 0, chat.stderr.read()
    finally:
        if chat is not None and chat.poll() is None:
            chat.kill()
        up.send_signal(signal.SIGINT)
        up.wait(60)
