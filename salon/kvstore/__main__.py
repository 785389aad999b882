"""`python -m salon.kvstore --port 0 --capacity-bytes 1073741824 ...`"""

from __future__ import annotations

import sys

from salon.common.config import parse_config
from salon.common.server import run
from salon.kvstore.bootstrap import KVStoreService
from salon.kvstore.config import KVStoreConfig


def main(argv: list[str] | None = None) -> None:
    config = parse_config(KVStoreConfig, argv, env_prefix="SALON_KVSTORE_")
    run(KVStoreService(config), config.server)


if __name__ == "__main__":
    main(sys.argv[1:])
