"""The start-up heap kept out of the garbage collector's full collections, and the collector's pauses measured.

A service's start-up leaves objects that live as long as the process: an engine's model modules and tokenizer
(some 200,000 tracked objects for Gemma 3 270M), a gateway's tenants and routes. CPython's full collection walks
every tracked object while it holds the GIL, so it stalls the engine's step thread and every event loop of the
process: about 50 ms with Gemma 3 270M loaded, each time the long-lived objects have grown by a quarter. Once a
service serves, its start-up heap is collected once and frozen (gc.freeze, as vLLM's engine core does after its
start-up): full collections then walk only what came later.

    watch_gc_pauses()      records each collection's wall time in salon_gc_pause_seconds{generation}
    freeze_startup_heap()  collects, then moves every tracked object to the permanent generation; the first call
                           only (a service turning SERVING again keeps what it froze)
"""

from __future__ import annotations

import gc
import threading
import time

from prometheus_client import Gauge, Histogram

GC_PAUSE_SECONDS = Histogram(
    "salon_gc_pause_seconds",
    "Wall time of the Python garbage collector's collections (the GIL held), by generation (2: full).",
    ["generation"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
GC_FROZEN_OBJECTS = Gauge(
    "salon_gc_frozen_objects",
    "Objects of the start-up heap that full collections no longer walk (gc.freeze when the service first served).",
)

# one child per generation, made here: the callback below only looks them up
_PAUSES = [GC_PAUSE_SECONDS.labels(generation=str(g)) for g in range(3)]

_lock = threading.Lock()
_started: list[float] = []  # the running collection's start (collections do not nest)
_watching = False
_frozen = False


def _on_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        _PAUSES[info["generation"]].observe(time.perf_counter() - _started.pop())


def watch_gc_pauses() -> None:
    """Record every collection's pause from now on (once per process)."""
    global _watching
    with _lock:
        if not _watching:
            gc.callbacks.append(_on_collection)
            _watching = True


def freeze_startup_heap() -> bool:
    """Collect, then freeze every tracked object; False (nothing done) after the first call."""
    global _frozen
    with _lock:
        if _frozen:
            return False
        _frozen = True
    gc.collect()
    gc.freeze()
    GC_FROZEN_OBJECTS.set(gc.get_freeze_count())
    return True
