"""One stack for the OpenAI API tests of a module: two synthetic-tiny engines behind a gateway that
serves the HTTP API, with three tenants (a plain one, a rate-limited one, and one for routing)."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from salon.common.process import ServiceProcess
from tests.hardening.hardening_stack import MODEL, engine_load, start_engine, start_gateway, stop_all, wait_gateway_sees

KEY = "sk-openai-tests-plain-5d1c"
KEY_LIMITED = "sk-openai-tests-limited-8e2f"
TENANTS = {
    "tenants": [
        {"tenant_id": "plain", "api_key": KEY, "namespace_salt": "salt-plain"},
        {
            "tenant_id": "limited",
            "api_key": KEY_LIMITED,
            "namespace_salt": "salt-limited",
            "requests_per_s": 0.05,
            "burst_requests": 1,
        },
    ]
}


@dataclass
class Stack:
    engines: dict[str, ServiceProcess]
    gateway: ServiceProcess
    tenants_path: Path

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.extra_ports['http_port']}"

    @property
    def base_url(self) -> str:
        return self.http_url + "/v1"

    def client(self, key: str = KEY, **kw):
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=120, **kw)

    def engine_metrics(self, engine_id: str) -> str:
        port = self.engines[engine_id].metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()

    def load(self, engine_id: str):
        return engine_load(self.engines[engine_id].address)


def start_stack(tmp: Path, num_engines: int = 2, engine_flags: tuple[str, ...] = ()) -> Stack:
    engines: dict[str, ServiceProcess] = {}
    gateway = None
    try:
        for i in range(num_engines):
            engines[f"e{i}"] = start_engine(f"e{i}", tmp, extra=["--metrics-port", "0", *engine_flags])
        tenants = tmp / "tenants.json"
        tenants.write_text(json.dumps(TENANTS))
        gateway = start_gateway(engines, tenants, tmp, extra=["--http-port", "0"])
        wait_gateway_sees(gateway, num_engines)
        return Stack(engines, gateway, tenants)
    except BaseException:
        stop_all([gateway, *engines.values()])
        raise


def stop_stack(stack: Stack) -> None:
    stop_all([stack.gateway, *stack.engines.values()])


__all__ = ["KEY", "KEY_LIMITED", "MODEL", "Stack", "start_stack", "stop_stack"]
