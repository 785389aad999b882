"""`python -m salon.engine --port 0 --model synthetic-tiny --engine-id e0 ...`"""

from __future__ import annotations

import sys

from salon.common.config import parse_config
from salon.common.server import run
from salon.engine.api.bootstrap import EngineService
from salon.engine.config import EngineConfig


def main(argv: list[str] | None = None) -> None:
    config = parse_config(EngineConfig, argv, env_prefix="SALON_ENGINE_")
    run(EngineService(config), config.server)


if __name__ == "__main__":
    main(sys.argv[1:])
