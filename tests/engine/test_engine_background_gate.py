"""The background gate (salon/engine/core/background.py): paused while the model computes; once the engine has
computed for the grace without idling, except during one step in one_step_in; resumed when the engine idles;
each change signalled once."""

from __future__ import annotations

import pytest

from salon.engine.core.background import BUSY_GRACE_S, BackgroundGate


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gate_with_log(one_step_in: int, grace_s: float = 0.25) -> tuple[BackgroundGate, list[str], Clock]:
    calls: list[str] = []
    clock = Clock()
    gate = BackgroundGate(
        lambda: calls.append("pause"), lambda: calls.append("resume"), one_step_in, grace_s=grace_s, clock=clock
    )
    return gate, calls, clock


def steps(gate: BackgroundGate, clock: Clock, n: int, step_s: float) -> list[bool]:
    states = []
    for _ in range(n):
        gate.computing()
        states.append(gate.paused)
        clock.now += step_s
    return states


def test_paused_through_the_grace_then_except_one_step_in_n_and_resumed_when_idle():
    gate, calls, clock = gate_with_log(3, grace_s=0.25)
    # Steps of 0.1 s: at 0, 0.1, 0.2 s within the grace; from 0.3 s one step in 3 runs the work.
    assert steps(gate, clock, 8, 0.1) == [True, True, True, True, True, False, True, True]
    assert calls == ["pause", "resume", "pause"]
    gate.idle()
    gate.idle()
    assert calls == ["pause", "resume", "pause", "resume"] and not gate.paused
    # The grace and the count start again after an idle spell.
    assert steps(gate, clock, 5, 0.1) == [True, True, True, True, True]
    assert calls[-1] == "pause" and len(calls) == 5


def test_short_replies_between_idle_spells_never_run_the_work_while_computing():
    gate, calls, clock = gate_with_log(8)
    for _ in range(50):  # 8-step replies of 10 ms steps, the engine idle between them
        assert steps(gate, clock, 8, 0.010) == [True] * 8
        gate.idle()
        clock.now += 0.005
    assert calls == ["pause", "resume"] * 50


def test_zero_pauses_for_every_step():
    gate, calls, clock = gate_with_log(0)
    assert steps(gate, clock, 200, 0.01) == [True] * 200
    assert calls == ["pause"]


def test_no_grace_is_one_step_in_n_from_the_first():
    gate, calls, clock = gate_with_log(3, grace_s=0.0)
    assert steps(gate, clock, 7, 0.01) == [True, True, False, True, True, False, True]


def test_the_default_grace_and_a_negative_share_is_refused():
    assert BackgroundGate(lambda: None, lambda: None, 8).grace_s == BUSY_GRACE_S == 0.25
    with pytest.raises(ValueError, match="one_step_in must be at least 0, got -1"):
        BackgroundGate(lambda: None, lambda: None, -1)
