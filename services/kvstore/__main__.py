"""`python -m services.kvstore --port 0 --capacity-bytes 1073741824 ...`"""

from __future__ import annotations

import sys

from services.common.config import parse_config
from services.common.server import run
from services.kvstore.config import KVStoreConfig
from services.kvstore.service import KVStoreService


def main(argv: list[str] | None = None) -> None:
    config = parse_config(KVStoreConfig, argv, env_prefix="SALON_KVSTORE_")
    run(KVStoreService(config), config.server)


if __name__ == "__main__":
    main(sys.argv[1:])
