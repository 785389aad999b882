"""`salon up`: start the local stack — kvstore, engine(s), gateway — as separate OS processes, and keep it up.

    salon up ── certificates and secrets (state dir/tls, salon/cli/certs.py), once
       ├─ kvstore   mTLS: engines only                 ┐ each child gets --parent-pid: it stops when salon up
       ├─ engine-i  mTLS: gateways only; → kvstore     │ is gone, however it went (SIGKILL, a closed terminal)
       │            (--engines of them per --model; the gateway keeps one pool per model)
       └─ gateway   public ports on loopback (API key) ┘
                    gRPC, and the OpenAI HTTP API (--http-port, 8000; 0 turns it off)
    supervise: a child that exits is logged and started again on the same port, with backoff
    (BACKOFF_INITIAL_S doubling to BACKOFF_MAX_S, reset once it has run for BACKOFF_RESET_S); so is one
    that stops answering its health check (health_probe.py: --health-probe-failures unanswered probes
    in a row, one every --health-probe-interval-s, get it SIGKILLed first); the others
    keep serving: the gateway fails over from a dead engine, engines recompute while the kvstore is
    down, and the kvstore keeps what it holds when an engine restarts.
    Ctrl-C, SIGTERM or SIGHUP: stop every child (SIGTERM, then the grace period) and exit 0.

`--internal-auth insecure-loopback` runs the internal links without TLS (development on one host).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from salon.cli.certs import StackSecrets, write_stack_secrets
from salon.cli.health_probe import PROBE_FAILURES, PROBE_INTERVAL_S, PROBE_TIMEOUT_S, HealthProbe, ProbeSettings
from salon.cli.private_dirs import PrivateDirError, checked_shm_dir, fresh_shm_dir, private_state_dir
from salon.common.internal_auth import INSECURE_LOOPBACK, MODES, MTLS
from salon.common.process import ServiceProcess, ServiceStartError, threads_per_process

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_HTTP_PORT = 8000
KNOWN_NAMES = ("smollm2-135m-instruct", "gemma-3-270m")
BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 30.0
BACKOFF_RESET_S = 60.0
_POLL_S = 0.2


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: give a number of seconds above 0")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: give 0 or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="salon up", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        action="append",
        default=None,
        help=f"model to serve: a known name ({', '.join(KNOWN_NAMES)}), synthetic-tiny or a .gguf path; "
        f"repeat it to serve several, one engine pool each (the first is the default; "
        f"default: {DEFAULT_MODEL})",
    )
    p.add_argument("--engines", type=int, default=1, help="engine processes per model")
    p.add_argument("--gateway-port", type=int, default=50051)
    p.add_argument(
        "--http-port",
        type=int,
        default=DEFAULT_HTTP_PORT,
        help=f"the gateway's OpenAI-compatible HTTP API on 127.0.0.1 (default: {DEFAULT_HTTP_PORT}; 0: off)",
    )
    p.add_argument("--kvstore-port", type=int, default=50061)
    p.add_argument("--engine-base-port", type=int, default=50071, help="engine i listens on base + i")
    p.add_argument("--metrics-base-port", type=int, default=9100, help="gateway, kvstore, engines: base, +1, +2...")
    p.add_argument("--kvstore-capacity-bytes", type=int, default=2 << 30)
    p.add_argument("--redis-url", default=None, help="share the session table through Redis")
    p.add_argument(
        "--api-key", default=os.environ.get("SALON_API_KEY", "salon-dev-key"), help="key of the local tenant"
    )
    p.add_argument("--state-dir", type=Path, default=Path.home() / ".cache" / "salon" / "stack")
    p.add_argument(
        "--shm-dir",
        type=Path,
        default=None,
        help="tmpfs directory for the kvstore's arena, ours with mode 0700 (default: a fresh private one in /dev/shm)",
    )
    p.add_argument(
        "--internal-auth",
        choices=MODES,
        default=MTLS,
        help="mtls: certificates for every internal link (made in STATE_DIR/tls); insecure-loopback: none",
    )
    p.add_argument("--exit-when-serving", action="store_true", help="stop everything once all are SERVING")
    p.add_argument(
        "--health-probe-interval-s",
        type=_positive_seconds,
        default=PROBE_INTERVAL_S,
        help="seconds between health checks of each child",
    )
    p.add_argument(
        "--health-probe-timeout-s",
        type=_positive_seconds,
        default=PROBE_TIMEOUT_S,
        help="a health check unanswered this long fails",
    )
    p.add_argument(
        "--health-probe-failures",
        type=_count,
        default=PROBE_FAILURES,
        help="failed health checks in a row after which a child is killed and restarted (0: no checks)",
    )
    return p


def write_tenants_file(state_dir: Path, api_key: str) -> Path:
    """The local tenant; its namespace salt is derived from the stack's salt secret."""
    path = state_dir / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"tenant_id": "local", "api_key": api_key}]}))
    path.chmod(0o600)
    return path


def write_pid_file(path: Path, pid: int) -> None:
    """Replace `path` with one holding `pid`: written beside it and renamed over it, so a reader sees the old
    pid or the new one, never an empty or half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, path)


@dataclass
class Child:
    """One supervised service: how to start it, and its current process."""

    name: str  # kvstore, engine-0, gateway
    service: str  # the salon.<service> module
    args: tuple[str, ...]
    log_path: Path
    pid_path: Path
    proc: ServiceProcess | None = None
    started_s: float = 0.0
    backoff_s: float = BACKOFF_INITIAL_S
    restart_at_s: float | None = None
    restarts: int = 0
    history: list[int | None] = field(default_factory=list)
    probe: HealthProbe | None = None  # of the current process (supervise_once opens it)

    def start(self) -> None:
        self.close_probe()
        self.proc = ServiceProcess(self.service, self.args, self.log_path, on_output=self.show).start(timeout_s=120)
        self.started_s = time.monotonic()
        self.restart_at_s = None
        write_pid_file(self.pid_path, self.proc.process.pid)

    def show(self, line: str) -> None:
        """A line the child prints on stdout (an engine's model conversion progress), on salon up's console."""
        print(f"{self.name}: {line}", flush=True)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.process is not None and self.proc.process.poll() is None

    def close_probe(self) -> None:
        if self.probe is not None:
            self.probe.close()
            self.probe = None

    def hung(self, now_s: float, settings: ProbeSettings) -> bool:
        """True when the running process has stopped answering its health check (health_probe.py)."""
        if settings.failures <= 0 or not self.alive:
            return False
        if self.probe is None:
            self.probe = HealthProbe(self.proc.health_address, settings)
        return self.probe.poll(now_s)


def _internal_flags(secrets: StackSecrets | None, role: str, mode: str) -> list[str]:
    if mode == INSECURE_LOOPBACK or secrets is None:
        return ["--internal-auth", INSECURE_LOOPBACK]
    files = secrets.roles[role]
    return [
        "--tls-cert-file",
        str(files.cert),
        "--tls-key-file",
        str(files.key),
        "--tls-client-ca-file",
        str(secrets.ca_cert),
        "--health-port",
        "0",
    ]


def _client_flags(secrets: StackSecrets | None, prefix: str, role: str, mode: str) -> list[str]:
    if mode == INSECURE_LOOPBACK or secrets is None:
        return []
    files = secrets.roles[role]
    return [
        f"--{prefix}-tls-ca-file",
        str(secrets.ca_cert),
        f"--{prefix}-tls-cert-file",
        str(files.cert),
        f"--{prefix}-tls-key-file",
        str(files.key),
    ]


def models_of(args: argparse.Namespace) -> list[str]:
    """The models to serve, in order (the first is the default), each once."""
    return list(dict.fromkeys(args.model or [DEFAULT_MODEL]))


def http_port_problem(port: int) -> str | None:
    """Why the gateway could not listen on 127.0.0.1:`port` for the HTTP API, or None. Checked before any
    child starts, so a taken port costs no model load and reads as one line instead of the gateway's
    traceback. The probe binds as the gateway does (SO_REUSEADDR), so a closed stack's TIME_WAIT
    connections do not count as taken."""
    if not port:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return (
                f"port {port} for the OpenAI HTTP API is not free on 127.0.0.1 ({exc.strerror}); "
                f"choose another with --http-port PORT, or turn the HTTP API off with --http-port 0"
            )
    return None


def stack_shm_dir(args: argparse.Namespace) -> Path:
    """The kvstore's tmpfs directory: --shm-dir (checked: ours, 0700), else a fresh private one."""
    if args.shm_dir is not None:
        return checked_shm_dir(args.shm_dir)
    return fresh_shm_dir(private_state_dir(args.state_dir))


def plan_stack(args: argparse.Namespace, shm_dir: Path | None = None) -> list[Child]:
    """The children, in start order (kvstore, engines, gateway); `shm_dir` from stack_shm_dir (default:
    made now)."""
    state = private_state_dir(args.state_dir)
    shm_dir = shm_dir or stack_shm_dir(args)
    secrets = write_stack_secrets(state / "tls")
    mode = args.internal_auth
    parent = ["--parent-pid", str(os.getpid())]
    kvstore_target = f"127.0.0.1:{args.kvstore_port}"
    children = [
        Child(
            "kvstore",
            "kvstore",
            (
                "--port",
                str(args.kvstore_port),
                "--metrics-port",
                str(args.metrics_base_port + 1),
                "--capacity-bytes",
                str(args.kvstore_capacity_bytes),
                "--namespace-grant-key-file",
                str(secrets.grant_key),
                "--shm-dir",
                str(shm_dir),
                *_internal_flags(secrets, "kvstore", mode),
                *parent,
            ),
            state / "kvstore.log",
            state / "kvstore.pid",
        )
    ]
    engine_targets = []
    models = models_of(args)
    num_engines = args.engines * len(models)
    for i in range(num_engines):
        model = models[i // args.engines]
        name = f"engine-{i}"
        port = args.engine_base_port + i
        children.append(
            Child(
                name,
                "engine",
                (
                    "--port",
                    str(port),
                    "--metrics-port",
                    str(args.metrics_base_port + 2 + i),
                    "--engine-id",
                    name,
                    "--model",
                    model,
                    "--kvstore-target",
                    kvstore_target,
                    "--kvstore-shm-dir",
                    str(shm_dir),
                    "--torch-threads",
                    str(threads_per_process(num_engines)),
                    *_internal_flags(secrets, "engine", mode),
                    *_client_flags(secrets, "kvstore", "engine", mode),
                    *parent,
                ),
                state / f"{name}.log",
                state / f"{name}.pid",
            )
        )
        engine_targets.append(f"{name}=127.0.0.1:{port}")
    gateway = [
        "--port",
        str(args.gateway_port),
        "--metrics-port",
        str(args.metrics_base_port),
        "--engines",
        ",".join(engine_targets),
        "--tenants-file",
        str(write_tenants_file(state, args.api_key)),
        "--salt-secret-file",
        str(secrets.salt_secret),
        "--namespace-grant-key-file",
        str(secrets.grant_key),
        "--default-model",
        models[0],
        *_client_flags(secrets, "engine", "gateway", mode),
        *parent,
    ]
    if mode == INSECURE_LOOPBACK:
        gateway += ["--internal-auth", INSECURE_LOOPBACK]
    if args.redis_url:
        gateway += ["--redis-url", args.redis_url]
    if args.http_port:
        gateway += ["--http-port", str(args.http_port)]
    children.append(Child("gateway", "gateway", tuple(gateway), state / "gateway.log", state / "gateway.pid"))
    return children


def start_stack(children: list[Child], models: list[str]) -> None:
    """Start every child and wait until each is SERVING (engines load in parallel)."""
    try:
        kvstore, *engines, gateway = children
        kvstore.start()
        kvstore.proc.wait_serving(timeout_s=120)
        for engine in engines:
            engine.start()
        print(
            f"loading {', '.join(models)} in {len(engines)} engine(s) (the first run converts each GGUF once)...",
            flush=True,
        )
        for engine in engines:
            engine.proc.wait_serving(timeout_s=1800)
        gateway.start()
        gateway.proc.wait_serving(timeout_s=120)
    except BaseException:
        stop_stack(children)
        raise


def stop_stack(children: list[Child]) -> None:
    for child in children:  # first: a stopping server's GOAWAY on an open probe channel is logged on the console
        child.close_probe()
    for child in reversed(children):
        if child.proc is not None:
            child.proc.stop()


def describe(children: list[Child], args: argparse.Namespace) -> str:
    gateway = children[-1].proc
    http_port = gateway.extra_ports.get("http_port")
    http = []
    if http_port is not None:  # where the gateway says it listens, with a request that works as it is
        base_url = f"http://127.0.0.1:{http_port}/v1"
        http = [
            f"  http      {base_url} (OpenAI API)",
            f"try it:        curl {base_url}/models -H {shlex.quote('Authorization: Bearer ' + args.api_key)}",
        ]
    rows = [
        f"  {c.name:<9} {c.proc.address:<18} pid {c.proc.process.pid:<7} metrics http://127.0.0.1:"
        f"{c.proc.metrics_port}/metrics"
        for c in children
    ]
    auth = (
        "mutual TLS between services (certificates in " + str(args.state_dir / "tls") + ")"
        if args.internal_auth == MTLS
        else "insecure-loopback: internal links without TLS (development)"
    )
    return "\n".join(
        [
            "salon is up:",
            *rows,
            *http[:1],
            f"  logs      {args.state_dir}",
            f"  internal  {auth}",
            f"models    {', '.join(models_of(args))} (default {models_of(args)[0]})",
            f"chat with it:  salon chat --target 127.0.0.1:{args.gateway_port} --api-key {args.api_key}",
            *http[1:],
            "Ctrl-C stops everything.",
        ]
    )


def _exit_description(code: int | None) -> str:
    if code is None:
        return "did not start"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def supervise_once(children: list[Child], now_s: float, probe: ProbeSettings | None = None) -> None:
    """Kill hung children, notice deaths (log, schedule a restart with backoff) and start children whose
    time has come."""
    for child in children:
        if probe is not None and child.restart_at_s is None and child.hung(now_s, probe):
            print(
                f"{child.name} (pid {child.proc.process.pid}) answered none of {probe.failures} health checks in a "
                f"row ({child.probe.last_error}, {probe.timeout_s:g} s each); killing it (SIGKILL)",
                file=sys.stderr,
                flush=True,
            )
            child.close_probe()
            child.proc.kill()
        if child.restart_at_s is None and not child.alive:
            code = child.proc.process.returncode if child.proc is not None else None
            child.history.append(code)
            if now_s - child.started_s >= BACKOFF_RESET_S:
                child.backoff_s = BACKOFF_INITIAL_S
            child.restart_at_s = now_s + child.backoff_s
            print(
                f"{child.name} {_exit_description(code)}; restarting it in {child.backoff_s:g} s "
                f"(log: {child.log_path})",
                file=sys.stderr,
                flush=True,
            )
            child.backoff_s = min(BACKOFF_MAX_S, child.backoff_s * 2)
        elif child.restart_at_s is not None and now_s >= child.restart_at_s:
            try:
                child.start()
            except ServiceStartError as exc:
                child.proc = None
                child.started_s = now_s
                child.restart_at_s = None  # noticed as dead on the next pass
                print(f"{child.name} did not start again: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
                continue
            child.restarts += 1
            print(
                f"{child.name} started again (pid {child.proc.process.pid}, restart {child.restarts})",
                file=sys.stderr,
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = http_port_problem(args.http_port)
    if problem:
        print(f"salon up: {problem}", file=sys.stderr)
        return 1
    stop = {"now": False}

    def request_stop(*_):
        stop["now"] = True

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, request_stop)
    try:
        private_state_dir(args.state_dir)
        shm_dir = stack_shm_dir(args)
    except PrivateDirError as exc:
        print(f"salon up: {exc}", file=sys.stderr)
        return 1
    children = plan_stack(args, shm_dir)
    try:
        start_stack(children, models_of(args))
    except ServiceStartError as exc:
        print(f"salon up failed: {exc}", file=sys.stderr)
        _remove_fresh_shm_dir(args, shm_dir)
        return 1
    print(describe(children, args), flush=True)
    stop["now"] = stop["now"] or args.exit_when_serving
    probe = ProbeSettings(args.health_probe_interval_s, args.health_probe_timeout_s, args.health_probe_failures)
    try:
        while not stop["now"]:
            supervise_once(children, time.monotonic(), probe)
            time.sleep(_POLL_S)
    finally:
        print("stopping...", flush=True)
        stop_stack(children)
        _remove_fresh_shm_dir(args, shm_dir)
    return 0


def _remove_fresh_shm_dir(args: argparse.Namespace, shm_dir: Path) -> None:
    if args.shm_dir is None:  # the private tmpfs directory goes once its arena has
        with contextlib.suppress(OSError):
            shm_dir.rmdir()
