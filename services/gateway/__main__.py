"""`python -m services.gateway --port 0 --engines e0=127.0.0.1:P0,e1=... --tenants-file F [--redis-url ...]`"""

from __future__ import annotations

from services.common.config import parse_config
from services.common.server import run
from services.gateway.config import GatewayConfig
from services.gateway.service import GatewayService


def main() -> None:
    config = parse_config(GatewayConfig, env_prefix="SALON_GATEWAY_")
    run(GatewayService(config), config.server)


if __name__ == "__main__":
    main()
