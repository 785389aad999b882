"""What the driver measured: one TurnRecord per turn, one RunResult per replay of a trace."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TurnRecord:
    dialogue_index: int
    turn_index: int
    kind: str
    # Seconds since the start of the run: when the request was sent and when its final event arrived.
    sent_s: float
    end_s: float
    # Client-side time from sending the request to the first delta carrying a token id; None when the
    # request failed or produced no token.
    ttft_ms: float | None
    # Client-side gaps between consecutive generated tokens (see driver.token_gaps_ms).
    itl_ms: tuple[float, ...]
    prompt_tokens: int
    # Prompt tokens the server did not compute (transport.TurnUsage): llama-server's prompt cache counts as device.
    cached_device_tokens: int
    cached_host_tokens: int
    generated_tokens: int
    engine_id: str
    finish_reason: str
    # The engine's own TTFT (GenerateFinal.timings.ttft_ms), from its arrival (before rendering) to the step
    # that produced the first token.
    server_ttft_ms: float | None
    # Generated ids (EOS included, as streamed): compared across runs to check cache exactness.
    reply_token_ids: tuple[int, ...] = ()
    # "<STATUS>: <details>" when the call failed.
    error: str | None = None
    # The engine's queue time (GenerateFinal.timings.queue_ms): arrival to the first step that scheduled it,
    # rendering and the kvstore lookup included. None where the server does not report it.
    server_queue_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def cached_tokens(self) -> int:
        return self.cached_device_tokens + self.cached_host_tokens

    @property
    def key(self) -> tuple[int, int]:
        return (self.dialogue_index, self.turn_index)


@dataclass(frozen=True)
class RunResult:
    label: str  # "cache", "no-cache" (salon) or "llama-server" (the peer)
    records: tuple[TurnRecord, ...]
    # From the start of the measured replay (after any priming) to the last final received.
    wall_s: float
    model_id: str = ""
    dropped_history_messages: int = 0
    # Whether each dialogue's history was served once before the clock started (WorkloadConfig.prime_history).
    primed: bool = False
    # prime_wall_s, prime_errors when primed; mode_detail (e.g. the working-set capacities) when set.
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)
