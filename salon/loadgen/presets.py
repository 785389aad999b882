"""The traces `salon bench` replays by name: a workload, how many turns run at once, and the clock.

Nothing is primed in any preset: every dialogue's first turn in the run prefills its history cold,
as a history the server has never seen (`--prime` asks for priming and is labelled as such).

  default        8 dialogues (4 at t=0, the rest arriving at 0.5/s), histories of mean 180 messages
                 (gamma; about 4,300 Gemma tokens), 4 turns, 24 new tokens, temperature 0.7, think
                 time mean 1 s, 10% "away" pauses (mean 8 s), 10% regenerations, 5% edits; 8 streams
  llama-server   the reference workload for the peer comparison: 16 dialogues at t=0, each with a
                 70-message history (about 1,900 Gemma tokens), 4 turns, 24 new tokens, greedy, no
                 think time; 4 streams
  working-set    many dialogues whose KV outgrows the caches: 24 dialogues (8 at t=0, the rest at
                 1/s), histories of mean 60 messages (about 1,500 tokens), 4 turns, 12 new tokens,
                 think time mean 1 s with 10% away pauses (so dialogues return after others evicted
                 them); 4 streams
Each has a quick variant (--quick). The default's keeps >= MIN_LONG_HISTORY_TURNS returning turns
with >= 4,000 prompt tokens: 4 dialogues of 180 messages (about 4,400 tokens) x 4 turns = 12.
"""

from __future__ import annotations

from dataclasses import dataclass

from salon.loadgen.workload import WorkloadConfig


@dataclass(frozen=True)
class Preset:
    name: str
    workload: WorkloadConfig
    concurrency: int
    time_scale: float


PRESETS = {
    "default": Preset("default", WorkloadConfig(prime_history=False), concurrency=8, time_scale=1.0),
    "quick": Preset(
        "quick",
        WorkloadConfig(
            num_dialogues=4,
            num_initial_dialogues=4,
            turns_per_dialogue=4,
            num_long_dialogues=4,
            long_history_messages=180,
            max_new_tokens=12,
            think_s_mean=0.2,
            away_fraction=0.0,
            regenerate_fraction=0.15,
            edit_fraction=0.15,
            prime_history=False,
        ),
        concurrency=8,
        time_scale=1.0,
    ),
    "llama-server": Preset(
        "llama-server",
        WorkloadConfig(
            num_dialogues=16,
            num_initial_dialogues=16,
            turns_per_dialogue=4,
            num_long_dialogues=16,
            long_history_messages=70,
            max_new_tokens=24,
            temperature=0.0,
            think_s_mean=0.0,
            away_fraction=0.0,
            prime_history=False,
        ),
        concurrency=4,
        time_scale=0.0,
    ),
    "llama-server-quick": Preset(
        "llama-server-quick",
        WorkloadConfig(
            num_dialogues=8,
            num_initial_dialogues=8,
            turns_per_dialogue=3,
            num_long_dialogues=8,
            long_history_messages=70,
            max_new_tokens=24,
            temperature=0.0,
            think_s_mean=0.0,
            away_fraction=0.0,
            prime_history=False,
        ),
        concurrency=4,
        time_scale=0.0,
    ),
    "working-set": Preset(
        "working-set",
        WorkloadConfig(
            num_dialogues=24,
            num_initial_dialogues=8,
            arrival_rate_per_s=1.0,
            turns_per_dialogue=4,
            history_messages_mean=60.0,
            history_messages_min=20,
            max_new_tokens=12,
            think_s_mean=1.0,
            away_fraction=0.1,
            away_s_mean=8.0,
            prime_history=False,
        ),
        concurrency=4,
        time_scale=1.0,
    ),
    "working-set-quick": Preset(
        "working-set-quick",
        WorkloadConfig(
            num_dialogues=16,
            num_initial_dialogues=8,
            arrival_rate_per_s=2.0,
            turns_per_dialogue=3,
            history_messages_mean=40.0,
            history_messages_min=16,
            max_new_tokens=8,
            think_s_mean=0.5,
            away_fraction=0.1,
            away_s_mean=4.0,
            prime_history=False,
        ),
        concurrency=4,
        time_scale=1.0,
    ),
}
NAMES = ("default", "llama-server", "working-set")


def preset(name: str, quick: bool) -> Preset:
    if name not in NAMES:
        raise ValueError(f"unknown preset {name!r} (one of {', '.join(NAMES)})")
    return PRESETS["quick" if name == "default" and quick else f"{name}-quick" if quick else name]
