"""`salon up` serves the OpenAI HTTP API: on 127.0.0.1:8000 unless --http-port says otherwise (0: off); a
taken port stops it at once with one line naming the port and the flag; run as the README runs it, the
`openai` SDK lists the model and chats through it, streamed and not, and the banner's curl line works."""

from __future__ import annotations

import json
import socket
import subprocess

import openai
from salon_up import salon_up
from test_cli_up_chat import SALON, free_ports

from salon.cli.up import DEFAULT_MODEL, build_parser, plan_stack


def _gateway_args(tmp_path, *flags: str) -> list[str]:
    args = build_parser().parse_args(["--state-dir", str(tmp_path / "state"), "--shm-dir", str(tmp_path), *flags])
    (gateway,) = [c for c in plan_stack(args) if c.name == "gateway"]
    return list(gateway.args)


def test_the_gateway_child_serves_http_on_8000_unless_told_otherwise(tmp_path):
    args = _gateway_args(tmp_path)
    assert args[args.index("--http-port") + 1] == "8000"
    args = _gateway_args(tmp_path, "--http-port", "8123")
    assert args[args.index("--http-port") + 1] == "8123"
    assert "--http-port" not in _gateway_args(tmp_path, "--http-port", "0")


def test_a_taken_http_port_stops_salon_up_before_anything_starts(tmp_path):
    gw, kv, eng, metrics = free_ports(4)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = ["--gateway-port", str(gw), "--kvstore-port", str(kv), "--engine-base-port", str(eng)]
        result = subprocess.run(
            [*SALON, "up", "--model", "synthetic-tiny", *ports, "--metrics-base-port", str(metrics)]
            + ["--http-port", str(port), "--state-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    assert f"port {port} for the OpenAI HTTP API" in line and "--http-port" in line, line
    assert not (tmp_path / "kvstore.log").exists()  # no child was started


def test_salon_up_as_the_readme_runs_it_serves_the_openai_api_on_8000(tmp_path):
    # The README's `salon up` with every default (model, ports, HTTP on 8000); only the state directory is
    # the test's own, so that a developer's stack state in ~/.cache/salon is left alone.
    with salon_up(tmp_path) as banner:
        assert any(line.startswith("  http      http://127.0.0.1:8000/v1 ") for line in banner), banner

        client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="salon-dev-key", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == [DEFAULT_MODEL]
        messages = [{"role": "user", "content": "Hello! How is the sea today?"}]
        whole = client.chat.completions.create(model=DEFAULT_MODEL, messages=messages, max_tokens=8, temperature=0)
        reply = whole.choices[0].message.content
        assert reply and 0 < whole.usage.completion_tokens <= 8
        chunks = client.chat.completions.create(
            model=DEFAULT_MODEL, messages=messages, max_tokens=8, temperature=0, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply

        (curl,) = [line.split(":", 1)[1].strip() for line in banner if line.startswith("try it:")]
        listed = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60, check=True)
        assert [m["id"] for m in json.loads(listed.stdout)["data"]] == [DEFAULT_MODEL]
