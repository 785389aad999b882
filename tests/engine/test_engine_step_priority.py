"""The step thread's nice value (EngineConfig.step_nice): raised on that thread only, inherited by the threads it
starts (OpenMP's workers)."""

import asyncio
import os
import threading

import pytest

from salon.engine.config import EngineConfig
from salon.engine.core.engine_loop import EngineLoop, lower_step_priority


def _in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("v", fn()))
    t.start()
    t.join()
    return out["v"]


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_raises_the_calling_threads_nice_value_only():
    before = _nice()

    def lowered():
        start = _nice()
        lower_step_priority(3)
        child = _in_thread(_nice)  # a thread started afterwards (as OpenMP's workers are) inherits it
        return start, _nice(), child

    start, after, child = _in_thread(lowered)
    assert after == min(start + 3, 19) and child == after
    assert _nice() == before  # the caller's own thread is untouched


def test_zero_leaves_it_unchanged():
    def run():
        start = _nice()
        lower_step_priority(0)
        return start, _nice()

    start, after = _in_thread(run)
    assert after == start


def test_default_raises_it():
    assert EngineConfig().step_nice == 10


def test_engine_loop_refuses_an_increment_outside_0_to_19():
    loop = asyncio.new_event_loop()
    try:
        for bad in (-1, 20):
            with pytest.raises(ValueError, match=f"step_nice must be 0..19 .*got {bad}"):
                EngineLoop(None, loop, step_nice=bad)
    finally:
        loop.close()
