"""Where an engine's resident memory goes: weights, the paged KV cache, the kvstore's arena, the rest.

    total   the process's RSS (/proc/self/smaps_rollup, `Rss:`)
    weights every tensor of the model (CausalLM.weight_bytes), and the CPU kernels' packed copies of its weights
            (salon.kernels.cpu.w8a8_grouped.packed_bytes: made by the warm-up's first step, counted after it)
    kv      the paged KV cache tensors as allocated (KVCache.allocated_bytes); torch allocates them zeroed
            from fresh pages, so only blocks written so far are resident
    arena   resident pages of the kvstore's shared-memory arena mapped into the engine (the kvstore's
            pages, shared by every engine of the host; /proc/self/smaps, mappings under the arena dir)
    other   total - weights - kv (at least 0): interpreter, libraries, kernels, step buffers, the arena

Measured at most once per MIN_INTERVAL_S: load reports and the gauge read the last measurement. A measurement
is not cheap: the kernel walks the page tables of every mapping for smaps_rollup and again for smaps (for Gemma's
3 GB engine with a kvstore arena, 50 ms to read both files with cat, about 120 ms of the event loop thread's
system time per measurement by its CPU ticks). Once a second the thread took 5% of a core, from the step's threads
(the event loop runs at a lower nice value), which on a 2-core host stalls a step's parallel regions; every 10 s
it took 1.8% (separate runs of the dialogue trace).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from salon.engine import metrics

MIN_INTERVAL_S = 10.0


@dataclass(frozen=True)
class Resident:
    total_bytes: int
    weights_bytes: int
    kv_cache_bytes: int
    other_bytes: int
    arena_bytes: int


def rss_bytes() -> int:
    """The process's resident set size (0 where /proc is missing)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def mapped_rss_bytes(path_prefix: str) -> int:
    """Resident bytes of the mappings whose file lies under path_prefix."""
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                first = line.split(None, 1)[0]
                if "-" in first and not first.endswith(":"):  # a mapping's header line
                    parts = line.split(None, 5)
                    inside = len(parts) == 6 and parts[5].startswith(path_prefix)
                elif inside and first == "Rss:":
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


class ResidentMeter:
    """The engine's resident bytes, measured at most once per MIN_INTERVAL_S, also set on the gauge."""

    def __init__(self, weights_bytes: int, kv_cache_bytes: int, arena_dir: str | None) -> None:
        self.weights_bytes = weights_bytes
        self.kv_cache_bytes = kv_cache_bytes
        self.arena_dir = arena_dir.rstrip("/") + "/" if arena_dir else None
        self._last: Resident | None = None
        self._at_s = 0.0

    def measure(self) -> Resident:
        now = time.monotonic()
        if self._last is not None and now - self._at_s < MIN_INTERVAL_S:
            return self._last
        total = rss_bytes()
        arena = mapped_rss_bytes(self.arena_dir) if self.arena_dir else 0
        other = max(0, total - self.weights_bytes - self.kv_cache_bytes)
        self._last, self._at_s = Resident(total, self.weights_bytes, self.kv_cache_bytes, other, arena), now
        for part, value in (
            ("total", total),
            ("weights", self.weights_bytes),
            ("kv_cache", self.kv_cache_bytes),
            ("other", other),
            ("arena", arena),
        ):
            metrics.RESIDENT_BYTES.labels(part).set(value)
        return self._last
