"""`salon up` restarts a child that stops answering its health check, not only one that exits: a
SIGSTOPped engine (alive, silent) is killed after the configured number of failed probes and started
again on its port, and the stack serves through it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
from test_cli_up_chat import SALON, up_args
from test_cli_up_supervise import _alive, _pid, _wait

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc

PROBE_FLAGS = ["--health-probe-interval-s", "0.3", "--health-probe-timeout-s", "0.5", "--health-probe-failures", "3"]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def test_salon_up_restarts_a_child_that_stops_answering(tmp_path: Path) -> None:
    gw, args = up_args(tmp_path)
    up = subprocess.Popen(
        [*SALON, *args, *PROBE_FLAGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    notices: list[str] = []
    threading.Thread(target=lambda: notices.extend(up.stderr), daemon=True).start()
    stopped: int | None = None
    children: list[int] = []
    try:
        deadline = time.monotonic() + 400
        line = ""
        while "Ctrl-C stops everything" not in line:
            line = up.stdout.readline()
            assert line or up.poll() is None, "".join(notices)
            assert time.monotonic() < deadline
        threading.Thread(target=lambda: [None for _ in up.stdout], daemon=True).start()
        children = [_pid(tmp_path, n) for n in ("kvstore", "engine-0", "gateway")]
        channel = grpc.insecure_channel(f"127.0.0.1:{gw}")
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        key = args[args.index("--api-key") + 1]
        assert _served_by(stub, key) == "engine-0"

        stopped = _pid(tmp_path, "engine-0")
        os.kill(stopped, signal.SIGSTOP)
        _wait(lambda: _pid(tmp_path, "engine-0") != stopped, 60, "the stopped engine was not started again")
        assert not _alive(stopped), "the stopped engine was restarted but not killed"
        assert any(
            f"engine-0 (pid {stopped}) answered none of 3 health checks in a row" in n and "killing it (SIGKILL)" in n
            for n in notices
        ), notices
        assert any("engine-0 was killed by SIGKILL; restarting it" in n for n in notices), notices
        # The stack serves again through the new engine; the others, probed all along, were left alone.
        _wait(lambda: _served_by(stub, key) == "engine-0", 120, "the stack did not serve through the new engine")
        assert [_pid(tmp_path, n) for n in ("kvstore", "gateway")] == [children[0], children[2]]
        assert up.poll() is None, "salon up stopped"
        channel.close()
    finally:
        if stopped is not None:
            _signal(stopped, signal.SIGCONT)
        children += [_pid(tmp_path, n) for n in ("kvstore", "engine-0", "gateway") if (tmp_path / f"{n}.pid").exists()]
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait(10)
        for pid in children:
            if _alive(pid):
                _signal(pid, signal.SIGKILL)


def _served_by(stub, key: str) -> str | None:
    """The engine that served a short turn, None when the turn failed."""
    request = chat_pb2.GenerateRequest(
        conversation_id="probe-dialogue",
        tokens=chat_pb2.TokenizedPrompt(token_ids=[2, 1124, 1124]),
        sampling=chat_pb2.SamplingParams(max_new_tokens=2),
    )
    try:
        events = list(stub.Generate(request, metadata=(("authorization", f"Bearer {key}"),), timeout=30))
    except grpc.RpcError:
        return None
    return events[-1].final.engine_id if events and events[-1].HasField("final") else None
