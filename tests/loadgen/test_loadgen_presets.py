"""The presets: what each trace holds, checked with the real tokenizer where token counts matter."""

import pytest

from salon.engine.api.prompt import Character
from salon.loadgen.dialogue import DialogueState
from salon.loadgen.presets import NAMES, preset
from salon.loadgen.report import DEFAULT_LONG_HISTORY_TOKENS, MIN_LONG_HISTORY_TURNS
from salon.loadgen.runs import load_rendering
from salon.loadgen.transport_llama_server import to_prompt_message
from salon.loadgen.workload import generate_trace


@pytest.fixture(scope="module")
def rendering():
    return load_rendering("gemma-3-270m")


def _history_tokens(trace, rendering):
    """Tokens of each dialogue's character block and history as salon renders them (no run message)."""
    out = []
    for d in trace.dialogues:
        messages = [to_prompt_message(m) for m in DialogueState(d).messages]
        out.append(len(rendering.renderer.render(Character(d.character_name, d.character_definition), messages)))
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("quick", [False, True])
def test_no_preset_primes(name, quick):
    assert preset(name, quick).workload.prime_history is False


def test_quick_long_history_ratio_rests_on_at_least_ten_returning_turns(rendering):
    """Unprimed, every turn but a dialogue's first returns; every prompt holds the whole history (turn 0 is
    always a new message, so edits and regenerations rewrite only run messages): a dialogue whose history
    alone renders to >= 4,000 tokens gives turns - 1 long returning turns."""
    trace = generate_trace(preset("default", quick=True).workload)
    history = _history_tokens(trace, rendering)
    long = [d for d, n in zip(trace.dialogues, history) if n >= DEFAULT_LONG_HISTORY_TOKENS]
    assert sum(len(d.turns) - 1 for d in long) >= MIN_LONG_HISTORY_TURNS, history
    assert len(long) >= 3  # not one dialogue's figure


def test_llama_server_preset_is_the_reference_workload(rendering):
    """16 dialogues x 4 turns, ~1.9k-token histories, 24 new tokens, greedy, 4 streams, no think time."""
    p = preset("llama-server", quick=False)
    w = p.workload
    assert (w.num_dialogues, w.num_initial_dialogues, w.turns_per_dialogue) == (16, 16, 4)
    assert (w.max_new_tokens, w.temperature, w.think_s_mean, w.away_fraction) == (24, 0.0, 0.0, 0.0)
    assert (p.concurrency, p.time_scale) == (4, 0.0)
    history = _history_tokens(generate_trace(w), rendering)
    assert 1700 <= sum(history) / len(history) <= 2100, history


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        preset("nope", False)
