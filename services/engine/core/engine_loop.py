"""The bridge between the asyncio gRPC servicers and the engine core's step thread.

    servicer (event loop)                        EngineLoop thread
      submit(request) ── commands queue ──────▶   add / abort / deadline checks
      events ◀── loop.call_soon_threadsafe ───   core.step() -> RequestEvent per request

The event loop never runs the model; the thread never touches asyncio objects except through
call_soon_threadsafe. Load figures are published as an immutable snapshot the servicers read.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import queue
import threading
import time
import traceback
from dataclasses import dataclass

from services.common.logging import get_logger
from services.engine import metrics
from services.engine.core.engine_core import EngineCore, LoadSnapshot
from services.engine.core.output import RequestEvent
from services.engine.core.request import FinishReason, Request, RequestId
from services.engine.kv.prefix_hit import PrefixHit

log = get_logger(__name__)


class CommandKind(enum.Enum):
    ADD = "add"  # queue `request` (with `host_hit`, KV the kvstore gave for it)
    ABORT = "abort"  # end `request_id`
    WAKE = "wake"  # nothing: lets a blocked wait see that the loop is stopping


@dataclass(frozen=True)
class Command:
    kind: CommandKind
    request: Request | None = None
    host_hit: PrefixHit | None = None
    request_id: str = ""
    # ADD: a request whose computed prompt the new one repeats (its KV is copied, EngineCore.add).
    prefill_from: RequestId | None = None


class _TokenRate:
    """Tokens per second over a sliding window (engine thread only)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self._window_s = window_s
        self._events: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, now: float, num_tokens: int) -> None:
        self._events.append((now, num_tokens))

    def rate(self, now: float) -> float:
        while self._events and self._events[0][0] < now - self._window_s:
            self._events.popleft()
        return sum(n for _, n in self._events) / self._window_s


class EngineLoop:
    def __init__(self, core: EngineCore, loop: asyncio.AbstractEventLoop) -> None:
        self.core = core
        self._loop = loop
        self._commands: queue.Queue[Command] = queue.Queue()
        self._streams: dict[str, asyncio.Queue] = {}  # event loop side only
        self._pending_admissions = 0  # event loop side: submitted, not yet seen by the thread
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-step-loop", daemon=True)
        self._rate = _TokenRate()
        self.load: LoadSnapshot = core.load()

    # ---- event-loop side -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._commands.put(Command(CommandKind.WAKE))
        self._thread.join(timeout=10)

    @property
    def num_waiting(self) -> int:
        return max(0, self.load.waiting_requests + self._pending_admissions)

    def submit(self, request: Request, host_hit: PrefixHit | None = None,
               prefill_from: RequestId | None = None) -> asyncio.Queue:
        """Hand a request to the step thread; its events arrive on the returned queue. prefill_from: a
        request whose computed prompt this one repeats (EngineCore.add)."""
        if request.request_id in self._streams:
            raise KeyError(request.request_id)
        events: asyncio.Queue = asyncio.Queue()
        self._streams[request.request_id] = events
        self._pending_admissions += 1
        self._commands.put(Command(CommandKind.ADD, request=request, host_hit=host_hit, prefill_from=prefill_from))
        return events

    def abort(self, request_id: str) -> bool:
        """End a running or queued request; its stream ends with FINISH_REASON_ABORTED."""
        if request_id not in self._streams:
            return False
        self._commands.put(Command(CommandKind.ABORT, request_id=request_id))
        return True

    def is_active(self, request_id: str) -> bool:
        return request_id in self._streams

    def fits(self, num_tokens: int) -> bool:
        """Whether a request of num_tokens tokens could ever fit in this engine's KV cache."""
        return self.core.fits(num_tokens)

    def probe_prefix(self, request: Request) -> int:
        """Tokens of the request's context the engine's own cache could give it now (a hint)."""
        return self.core.probe_prefix(request)

    def _deliver(self, event: RequestEvent) -> None:
        stream = self._streams.get(event.request_id)
        if stream is None:
            return
        if event.finish_reason is not None:
            del self._streams[event.request_id]
        stream.put_nowait(event)

    def _admitted(self) -> None:
        self._pending_admissions -= 1

    # ---- step thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain_commands(block=not self.core.has_work())
                self._expire_deadlines()
                if self.core.has_work():
                    self._step()
                self._publish()
            except Exception:  # a failed step must not kill the loop: fail the requests it held
                log.error("engine_step_failed", error=traceback.format_exc())
                for event in self.core.fail_all("internal error in the engine step"):
                    self._send(event)

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.05) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, command: Command) -> None:
        if command.kind is CommandKind.ADD:
            assert command.request is not None
            self._loop.call_soon_threadsafe(self._admitted)
            metrics.PROMPT_TOKENS.inc(command.request.num_prompt_tokens)
            self.core.add(command.request, command.host_hit, command.prefill_from)
        elif command.kind is CommandKind.ABORT:
            event = self.core.abort(command.request_id, FinishReason.ABORTED)
            if event is not None:
                self._send(event)

    def _expire_deadlines(self) -> None:
        for request_id in self.core.expired(time.monotonic()):
            event = self.core.abort(request_id, FinishReason.ABORTED, error="deadline exceeded")
            if event is not None:
                self._send(event)

    def _step(self) -> None:
        events = self.core.step()
        stats = self.core.last_step
        now = time.monotonic()
        if stats is not None:
            metrics.STEP_DURATION.observe(stats.duration_s)
            metrics.BATCH_SIZE.observe(stats.num_sequences)
            metrics.BATCH_TOKENS.observe(stats.num_batched_tokens)
            metrics.NUM_PREEMPTIONS.inc(stats.num_preempted)
            metrics.GENERATION_TOKENS.inc(stats.num_sampled)
            self._rate.add(now, stats.num_sampled)
        for event in events:
            if event.inter_token_s is not None:
                metrics.INTER_TOKEN_LATENCY.observe(event.inter_token_s)
            final = event.final
            if final is not None:
                metrics.TIME_TO_FIRST_TOKEN.observe(final.ttft_ms / 1000.0)
                metrics.REQUEST_QUEUE_TIME.observe(final.queue_ms / 1000.0)
                metrics.E2E_REQUEST_LATENCY.observe(final.total_ms / 1000.0)
                metrics.REQUEST_PROMPT_TOKENS.observe(final.prompt_tokens)
                metrics.REQUEST_GENERATION_TOKENS.observe(final.generated_tokens)
            self._send(event)

    def _send(self, event: RequestEvent) -> None:
        if event.finish_reason is not None:
            metrics.REQUEST_SUCCESS.labels(event.finish_reason.value).inc()
        self._loop.call_soon_threadsafe(self._deliver, event)

    def _publish(self) -> None:
        snap = self.core.load(self._rate.rate(time.monotonic()))
        self.load = snap  # one reference assignment: readers see a whole snapshot
        metrics.NUM_REQUESTS_RUNNING.set(snap.running_requests)
        metrics.NUM_REQUESTS_WAITING.set(snap.waiting_requests)
        metrics.KV_BLOCKS_FREE.set(snap.free_kv_blocks)
        metrics.KV_BLOCKS_CACHED.set(snap.cached_kv_blocks)
        used_blocks = snap.total_kv_blocks - snap.free_kv_blocks - snap.cached_kv_blocks
        metrics.KV_BLOCKS_USED.set(used_blocks)
        metrics.KV_CACHE_USAGE_RATIO.set(used_blocks / snap.total_kv_blocks if snap.total_kv_blocks else 0.0)
        metrics.DECODE_TOKENS_PER_S.set(snap.decode_tokens_per_s)
