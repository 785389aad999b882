"""`python -m salon.gateway --port 0 --engines e0=127.0.0.1:P0,e1=... --tenants-file F [--redis-url ...]`"""

from __future__ import annotations

from salon.common.config import parse_config
from salon.common.server import run
from salon.gateway.bootstrap import GatewayService
from salon.gateway.config import GatewayConfig


def main() -> None:
    config = parse_config(GatewayConfig, env_prefix="SALON_GATEWAY_")
    run(GatewayService(config), config.server)


if __name__ == "__main__":
    main()
