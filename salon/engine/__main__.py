"""`python -m salon.engine --port 0 --model synthetic-tiny --engine-id e0 ...`"""

from __future__ import annotations

import sys

from salon.engine.openmp_spin import bound_openmp_spin

bound_openmp_spin()  # before torch loads libgomp

from salon.common.config import parse_config  # noqa: E402
from salon.common.server import run  # noqa: E402
from salon.engine.api.bootstrap import EngineService  # noqa: E402
from salon.engine.config import EngineConfig  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    config = parse_config(EngineConfig, argv, env_prefix="SALON_ENGINE_")
    run(EngineService(config), config.server)


if __name__ == "__main__":
    main(sys.argv[1:])
