"""A seeded synthetic dialogue workload modelled on Character.AI's traffic.

Shape of the traffic (each knob is a field of WorkloadConfig):
- many dialogues at once, each a character definition plus a long pre-existing history of
  alternating user / character messages (mean `history_messages_mean`, gamma-distributed, shape 2);
  short messages (user ~`user_words_mean` words, character ~`character_words_mean` words);
- `num_long_dialogues` of them get exactly `long_history_messages` messages instead, so a trace can
  be sure to contain long-history dialogues however few dialogues it has;
- dialogues arrive over time: `num_initial_dialogues` at t=0, the rest as a Poisson process;
- each dialogue then plays `turns_per_dialogue` turns; before each turn the user thinks
  (exponential, mean `think_s_mean`) or, with probability `away_fraction`, leaves and comes back
  later (exponential, mean `away_s_mean`);
- a turn is a new user message, or (after the first turn) a regeneration of the last reply
  (`regenerate_fraction`) or an edit of the last user message (`edit_fraction`);
- `prime_history` (off by default): the histories were served before the run, as in a product where
  every message went through the service. Before the clock starts, the driver replays each
  dialogue's previous session's last turn (the history without its last reply, one new token,
  unmeasured), so the first measured turn is a returning user. Without it (the default), every
  dialogue's first turn prefills its whole history cold, as a history the server has never seen.

Reproducibility: dialogue i is generated from its own generator seeded with (seed, i) and the
arrival times from (seed, "arrivals"), so the same config gives the same trace, and dialogue i does
not change when `num_dialogues` grows.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from enum import Enum

from salon.loadgen.words import make_name, make_text


class Role(str, Enum):
    USER = "user"
    CHARACTER = "character"


class TurnKind(str, Enum):
    MESSAGE = "message"  # the user sends a new message
    REGENERATE = "regenerate"  # the last reply is dropped and generated again
    EDIT = "edit"  # the last reply and the last user message are dropped; an edited user message is sent


@dataclass(frozen=True)
class WorkloadConfig:
    """Knobs of the synthetic workload. Defaults: the full default trace of `salon bench`."""

    seed: int = 0
    num_dialogues: int = 8
    num_initial_dialogues: int = 4
    arrival_rate_per_s: float = 0.5
    turns_per_dialogue: int = 4
    history_messages_mean: float = 180.0
    history_messages_min: int = 2
    num_long_dialogues: int = 0
    long_history_messages: int = 0
    user_words_mean: float = 10.0
    character_words_mean: float = 20.0
    definition_words: int = 60
    regenerate_fraction: float = 0.1
    edit_fraction: float = 0.05
    think_s_mean: float = 1.0
    away_fraction: float = 0.1
    away_s_mean: float = 8.0
    max_new_tokens: int = 24
    prime_history: bool = False
    temperature: float = 0.7
    top_p: float = 0.95

    def __post_init__(self) -> None:
        if self.num_dialogues < 1 or self.turns_per_dialogue < 1:
            raise ValueError("num_dialogues and turns_per_dialogue must be >= 1")
        # Counts of initial / long dialogues above num_dialogues mean "all of them".
        if self.num_initial_dialogues < 0 or self.num_long_dialogues < 0:
            raise ValueError("num_initial_dialogues and num_long_dialogues must be >= 0")
        if self.regenerate_fraction < 0 or self.edit_fraction < 0 or self.regenerate_fraction + self.edit_fraction > 1:
            raise ValueError("regenerate_fraction and edit_fraction must be >= 0 and sum to <= 1")
        if self.history_messages_min < 0 or self.history_messages_mean < 0:
            raise ValueError("history lengths must be >= 0")
        if self.arrival_rate_per_s <= 0 or self.max_new_tokens < 1:
            raise ValueError("arrival_rate_per_s must be > 0 and max_new_tokens >= 1")


@dataclass(frozen=True)
class HistoryMessage:
    role: Role
    author: str
    text: str


@dataclass(frozen=True)
class TurnAction:
    kind: TurnKind
    # Pause before sending this turn, after the previous reply ended (or after arrival for turn 0).
    think_s: float
    # The new or edited user message; None for a regeneration.
    user_text: str | None
    # Seed of the sampler for this turn's reply.
    sampling_seed: int


@dataclass(frozen=True)
class DialogueSpec:
    dialogue_index: int
    conversation_id: str
    character_name: str
    character_definition: str
    user_name: str
    arrival_s: float
    # Alternating user/character messages, starting with the user and ending with the character.
    history: tuple[HistoryMessage, ...]
    turns: tuple[TurnAction, ...]


@dataclass(frozen=True)
class Trace:
    config: WorkloadConfig
    dialogues: tuple[DialogueSpec, ...] = field(default_factory=tuple)

    @property
    def num_turns(self) -> int:
        return sum(len(d.turns) for d in self.dialogues)

    def to_dict(self) -> dict:
        return asdict(self)


def _words(rng: random.Random, mean: float) -> int:
    """Message length in words: gamma (shape 2) around `mean`, at least 1."""
    return max(1, round(rng.gammavariate(2.0, mean / 2.0))) if mean > 0 else 1


def _history_length(rng: random.Random, config: WorkloadConfig, is_long: bool) -> int:
    """An even number of messages (user/character pairs), at least history_messages_min rounded up to even."""
    min_pairs = (config.history_messages_min + 1) // 2
    if is_long:  # exactly as configured, rounded up to whole pairs
        return 2 * max((config.long_history_messages + 1) // 2, min_pairs)
    raw = rng.gammavariate(2.0, config.history_messages_mean / 2.0) if config.history_messages_mean > 0 else 0.0
    return 2 * max(round(raw / 2.0), min_pairs)


def _turn_kind(rng: random.Random, config: WorkloadConfig, turn_index: int) -> TurnKind:
    if turn_index == 0:  # the first turn of a returning dialogue is always a new message
        return TurnKind.MESSAGE
    draw = rng.random()
    if draw < config.regenerate_fraction:
        return TurnKind.REGENERATE
    if draw < config.regenerate_fraction + config.edit_fraction:
        return TurnKind.EDIT
    return TurnKind.MESSAGE


def _dialogue(config: WorkloadConfig, index: int, arrival_s: float) -> DialogueSpec:
    rng = random.Random(f"{config.seed}:dialogue:{index}")
    character, user = make_name(rng), make_name(rng)
    definition = f"{character} is a character in a long story. " + make_text(rng, config.definition_words)
    history = tuple(
        HistoryMessage(role, name, make_text(rng, _words(rng, mean)))
        for i in range(_history_length(rng, config, index < config.num_long_dialogues))
        for role, name, mean in [
            (Role.USER, user, config.user_words_mean)
            if i % 2 == 0
            else (Role.CHARACTER, character, config.character_words_mean)
        ]
    )
    turns = []
    for t in range(config.turns_per_dialogue):
        kind = _turn_kind(rng, config, t)
        if t == 0:
            think_s = 0.0
        elif rng.random() < config.away_fraction:
            think_s = rng.expovariate(1.0 / config.away_s_mean) if config.away_s_mean > 0 else 0.0
        else:
            think_s = rng.expovariate(1.0 / config.think_s_mean) if config.think_s_mean > 0 else 0.0
        text = None if kind is TurnKind.REGENERATE else make_text(rng, _words(rng, config.user_words_mean))
        turns.append(TurnAction(kind, round(think_s, 3), text, rng.getrandbits(63)))
    return DialogueSpec(
        dialogue_index=index,
        conversation_id=f"bench-{config.seed}-{index}",
        character_name=character,
        character_definition=definition,
        user_name=user,
        arrival_s=arrival_s,
        history=history,
        turns=tuple(turns),
    )


def arrival_times_s(config: WorkloadConfig) -> list[float]:
    rng = random.Random(f"{config.seed}:arrivals")
    times, now = [], 0.0
    for i in range(config.num_dialogues):
        if i >= config.num_initial_dialogues:
            now += rng.expovariate(config.arrival_rate_per_s)
        times.append(round(now, 3))
    return times


def generate_trace(config: WorkloadConfig) -> Trace:
    arrivals = arrival_times_s(config)
    return Trace(config, tuple(_dialogue(config, i, arrivals[i]) for i in range(config.num_dialogues)))
