"""Work the engine does beside the model (compiling constraints, in processes of its own), held off the cores
while the model computes.

    BackgroundGate(pause, resume, one_step_in)   pause/resume: the background work's own (e.g. the grammar
                                                  compiler's pause_workers / resume_workers)
    computing()                                   before each step (step thread): paused; once the engine has
                                                  computed for BUSY_GRACE_S without idling, except during one
                                                  step in one_step_in, so a busy engine still compiles
    idle()                                        when the step thread runs out of work: resumed

On 2 cores, a worker computing beside the model, even in the scheduler's idle class, got the step's two threads
woken onto one core (an SmolLM2 step 8 -> 27 ms; salon/engine/grammar/compiler.py). One step in one_step_in
(0: none) lets the work progress on an engine that never idles, at a bounded cost to that step alone. Not
before BUSY_GRACE_S of computing: a short reply (8 tokens: 8 steps) took that step every time a too-slow schema
kept a compilation pending (another client's p90 +32 ms against +23 ms with workers only in idle spells;
tests/openai/test_openai_hostile_schemas.py, 4 alternated runs each), while an engine that idles between short
replies gives its workers those spells anyway. A constraint waits at most BUSY_GRACE_S longer on an engine
that never idles.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BUSY_GRACE_S = 0.25


class BackgroundGate:
    def __init__(
        self,
        pause: Callable[[], None],
        resume: Callable[[], None],
        one_step_in: int,
        grace_s: float = BUSY_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if one_step_in < 0:
            raise ValueError(f"one_step_in must be at least 0, got {one_step_in}")
        self._pause = pause
        self._resume = resume
        self.one_step_in = one_step_in
        self.grace_s = grace_s
        self._clock = clock
        self.paused = False
        self._busy_since: float | None = None  # the first step since the engine last went idle
        self._steps = 0  # busy steps past the grace

    def computing(self) -> None:
        now = self._clock()
        if self._busy_since is None:
            self._busy_since = now
        if now - self._busy_since < self.grace_s:
            self._set(True)
            return
        self._steps += 1
        self._set(not (self.one_step_in and self._steps % self.one_step_in == 0))

    def idle(self) -> None:
        self._busy_since = None
        self._steps = 0
        self._set(False)

    def _set(self, paused: bool) -> None:
        if paused != self.paused:
            self.paused = paused
            (self._pause if paused else self._resume)()
