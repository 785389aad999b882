"""`salon bench`: replay a Character.AI-style dialogue workload through the gateway."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    sys.stderr.write(
        "salon bench: not built yet — the dialogue workload generator arrives with the cross-turn KV cache "
        "(engine <-> kvstore wiring). Component benchmarks exist under bench/.\n"
    )
    return 2
