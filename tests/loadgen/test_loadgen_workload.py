"""The synthetic workload: seeded, reproducible, and shaped as configured."""

import dataclasses
import statistics

import pytest

from salon.loadgen.workload import Role, TurnKind, WorkloadConfig, arrival_times_s, generate_trace


def test_same_seed_gives_identical_trace():
    config = WorkloadConfig(seed=7, num_dialogues=6, history_messages_mean=40)
    assert generate_trace(config).to_dict() == generate_trace(config).to_dict()
    assert generate_trace(config) == generate_trace(dataclasses.replace(config))


def test_different_seeds_give_different_traces():
    a = generate_trace(WorkloadConfig(seed=1, num_dialogues=4, num_initial_dialogues=1, history_messages_mean=20))
    b = generate_trace(WorkloadConfig(seed=2, num_dialogues=4, num_initial_dialogues=1, history_messages_mean=20))
    assert a.dialogues[0].history != b.dialogues[0].history
    assert a.dialogues[0].character_definition != b.dialogues[0].character_definition
    assert [d.arrival_s for d in a.dialogues] != [d.arrival_s for d in b.dialogues]


def test_dialogue_does_not_change_when_more_dialogues_are_added():
    small = generate_trace(WorkloadConfig(seed=3, num_dialogues=2, num_initial_dialogues=2, history_messages_mean=30))
    large = generate_trace(WorkloadConfig(seed=3, num_dialogues=9, num_initial_dialogues=2, history_messages_mean=30))
    assert large.dialogues[:2] == small.dialogues


@pytest.mark.parametrize("mean", [12.0, 60.0, 180.0])
def test_mean_history_length_matches_config(mean):
    trace = generate_trace(
        WorkloadConfig(
            seed=11,
            num_dialogues=400,
            history_messages_mean=mean,
            history_messages_min=2,
            turns_per_dialogue=1,
            definition_words=5,
        )
    )
    lengths = [len(d.history) for d in trace.dialogues]
    # Gamma(shape 2) over 400 dialogues: the standard error of the mean is mean/sqrt(800) ~ 3.5% of it.
    assert abs(statistics.fmean(lengths) - mean) / mean < 0.12
    assert min(lengths) >= 2
    assert statistics.pstdev(lengths) > mean / 4  # a spread, not a constant


def test_histories_alternate_and_end_with_the_character():
    trace = generate_trace(WorkloadConfig(seed=5, num_dialogues=30, history_messages_mean=25, history_messages_min=3))
    for d in trace.dialogues:
        assert len(d.history) % 2 == 0 and len(d.history) >= 4
        assert [m.role for m in d.history] == [Role.USER, Role.CHARACTER] * (len(d.history) // 2)
        assert all(m.author == (d.user_name if m.role is Role.USER else d.character_name) for m in d.history)
        assert all(m.text and m.text[0].isupper() and m.text[-1] in ".!?" for m in d.history)


def test_message_lengths_match_config():
    trace = generate_trace(
        WorkloadConfig(seed=9, num_dialogues=40, history_messages_mean=100, user_words_mean=8, character_words_mean=30)
    )
    user = [len(m.text.split()) for d in trace.dialogues for m in d.history if m.role is Role.USER]
    char = [len(m.text.split()) for d in trace.dialogues for m in d.history if m.role is Role.CHARACTER]
    assert abs(statistics.fmean(user) - 8) < 0.8
    assert abs(statistics.fmean(char) - 30) < 2.0


def test_long_dialogues_get_the_long_history():
    trace = generate_trace(
        WorkloadConfig(
            seed=2, num_dialogues=5, num_long_dialogues=2, long_history_messages=301, history_messages_mean=10
        )
    )
    assert [len(d.history) for d in trace.dialogues[:2]] == [302, 302]  # rounded to whole pairs
    assert all(len(d.history) < 100 for d in trace.dialogues[2:])


def test_turn_kind_fractions_match_config():
    config = WorkloadConfig(
        seed=4,
        num_dialogues=300,
        turns_per_dialogue=11,
        history_messages_mean=4,
        regenerate_fraction=0.2,
        edit_fraction=0.1,
        definition_words=5,
    )
    trace = generate_trace(config)
    later = [t for d in trace.dialogues for t in d.turns[1:]]
    assert len(later) == 3000
    regen = sum(t.kind is TurnKind.REGENERATE for t in later) / len(later)
    edit = sum(t.kind is TurnKind.EDIT for t in later) / len(later)
    # Binomial standard errors: ~0.0073 and ~0.0055.
    assert abs(regen - 0.2) < 0.03
    assert abs(edit - 0.1) < 0.025
    assert all(d.turns[0].kind is TurnKind.MESSAGE and d.turns[0].think_s == 0.0 for d in trace.dialogues)
    assert all((t.user_text is None) == (t.kind is TurnKind.REGENERATE) for t in later)


def test_think_times_and_away_pauses():
    config = WorkloadConfig(
        seed=6,
        num_dialogues=200,
        turns_per_dialogue=6,
        history_messages_mean=2,
        think_s_mean=2.0,
        away_fraction=0.0,
        definition_words=5,
    )
    thinks = [t.think_s for d in generate_trace(config).dialogues for t in d.turns[1:]]
    assert abs(statistics.fmean(thinks) - 2.0) < 0.25
    away = dataclasses.replace(config, away_fraction=1.0, away_s_mean=30.0)
    aways = [t.think_s for d in generate_trace(away).dialogues for t in d.turns[1:]]
    assert abs(statistics.fmean(aways) - 30.0) < 3.5


def test_arrivals_initial_then_poisson():
    config = WorkloadConfig(seed=8, num_dialogues=2003, num_initial_dialogues=3, arrival_rate_per_s=4.0)
    times = arrival_times_s(config)
    assert times[:3] == [0.0, 0.0, 0.0]
    assert all(b >= a for a, b in zip(times, times[1:]))
    gaps = [b - a for a, b in zip(times[3:], times[4:])]
    assert abs(statistics.fmean(gaps) - 0.25) < 0.02


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="regenerate_fraction"):
        WorkloadConfig(regenerate_fraction=0.7, edit_fraction=0.5)
    with pytest.raises(ValueError, match="num_initial_dialogues"):
        WorkloadConfig(num_dialogues=2, num_initial_dialogues=-1)
    assert arrival_times_s(WorkloadConfig(num_dialogues=2, num_initial_dialogues=3)) == [0.0, 0.0]
