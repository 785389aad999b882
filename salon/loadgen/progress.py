"""A progress bar on stderr for one replay: turns done, hit rate and errors so far."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from salon.loadgen.records import TurnRecord
from salon.loadgen.report import hit_rate

T = TypeVar("T")


def with_progress(label: str, total_turns: int, disabled: bool, fn: Callable[[Callable[[TurnRecord], None]], T]) -> T:
    """Calls fn(on_turn) with a callback that advances a bar labelled `label`; closes the bar after."""
    from tqdm import tqdm

    bar = tqdm(total=total_turns, desc=f"bench [{label}]", unit="turn", file=sys.stderr, disable=disabled)
    seen: list[TurnRecord] = []

    def on_turn(record: TurnRecord) -> None:
        seen.append(record)
        rate = hit_rate(seen)
        bar.set_postfix(
            hit_rate="-" if rate is None else f"{rate:.3f}", errors=sum(not r.ok for r in seen), refresh=False
        )
        bar.update(1)

    try:
        return fn(on_turn)
    finally:
        bar.close()
