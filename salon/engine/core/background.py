"""Work the engine does beside the model (compiling constraints, in processes of its own), held off the cores
while the model computes.

    BackgroundGate(pause, resume, one_step_in)   pause/resume: the background work's own (e.g. the grammar
                                                  compiler's pause_workers / resume_workers)
    computing()                                   before each step (step thread): paused, except during one
                                                  step in one_step_in, so a busy engine still compiles
    idle()                                        when the step thread runs out of work: resumed

On 2 cores, a worker computing beside the model, even in the scheduler's idle class, got the step's two threads
woken onto one core (an SmolLM2 step 8 -> 27 ms; salon/engine/grammar/compiler.py). One step in one_step_in
(0: none) lets the work progress on an engine that never idles, at a bounded cost to that step alone.
"""

from __future__ import annotations

from collections.abc import Callable


class BackgroundGate:
    def __init__(self, pause: Callable[[], None], resume: Callable[[], None], one_step_in: int) -> None:
        if one_step_in < 0:
            raise ValueError(f"one_step_in must be at least 0, got {one_step_in}")
        self._pause = pause
        self._resume = resume
        self.one_step_in = one_step_in
        self.paused = False
        self._steps = 0  # busy steps since the engine last went idle

    def computing(self) -> None:
        self._steps += 1
        self._set(not (self.one_step_in and self._steps % self.one_step_in == 0))

    def idle(self) -> None:
        self._steps = 0
        self._set(False)

    def _set(self, paused: bool) -> None:
        if paused != self.paused:
            self.paused = paused
            (self._pause if paused else self._resume)()
