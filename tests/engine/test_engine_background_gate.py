"""The background gate (salon/engine/core/background.py): paused while the model computes, except during one
step in one_step_in, resumed when the engine idles; each change signalled once."""

from __future__ import annotations

import pytest

from salon.engine.core.background import BackgroundGate


def gate_with_log(one_step_in: int) -> tuple[BackgroundGate, list[str]]:
    calls: list[str] = []
    return BackgroundGate(lambda: calls.append("pause"), lambda: calls.append("resume"), one_step_in), calls


def test_paused_while_computing_except_one_step_in_n_and_resumed_when_idle():
    gate, calls = gate_with_log(3)
    states = []
    for _ in range(7):
        gate.computing()
        states.append(gate.paused)
    assert states == [True, True, False, True, True, False, True]
    assert calls == ["pause", "resume", "pause", "resume", "pause"]
    gate.idle()
    gate.idle()
    assert calls[-1] == "resume" and len(calls) == 6 and not gate.paused
    gate.computing()  # the count starts again after an idle spell
    gate.computing()
    assert calls[-1] == "pause" and len(calls) == 7


def test_zero_pauses_for_every_step():
    gate, calls = gate_with_log(0)
    for _ in range(20):
        gate.computing()
    assert calls == ["pause"]


def test_a_negative_share_is_refused():
    with pytest.raises(ValueError, match="one_step_in must be at least 0, got -1"):
        BackgroundGate(lambda: None, lambda: None, -1)
