"""`salon up` starts the three services as processes and stops them; `salon chat` streams replies
through it and shows the cross-turn cache at work from the second turn on."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SALON = [sys.executable, "-m", "salon.cli.main"]


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


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
            input="Tell me about the harbour.\nAnd the lighthouse?\n",
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert chat.returncode == 0, chat.stderr
        usages = re.findall(r"\[(\d+) prompt tokens, (\d+) cached, (\d+) generated", chat.stdout)
        assert len(usages) == 2, chat.stdout
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
