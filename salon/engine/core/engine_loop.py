"""The bridge between the asyncio gRPC servicers and the engine core's step thread.

    servicer (event loop)                        EngineLoop thread
      submit(request) ── commands queue ──────▶   add / abort / deadline checks
      events ◀── loop.call_soon_threadsafe ───   core.step() -> RequestEvent per request

The event loop never runs the model; the thread never touches asyncio objects except through
call_soon_threadsafe. Load figures are published as an immutable snapshot the servicers read.

Faults stay local: a step that raises fails the requests of that step (core.in_step) and the loop
goes on with the rest. When the step itself cannot go on — MAX_CONSECUTIVE_STEP_FAILURES failures in
a row, an error no request of the step explains, memory or device errors, or the thread ending for
any reason but stop() — every request fails, `dead` is set (submit refuses work) and `on_fatal` is
called on the event loop: the service reports NOT_SERVING and exits for its supervisor to restart
it. The engine never keeps running with a dead step thread.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from salon.common.logging import get_logger
from salon.engine import metrics
from salon.engine.core.background import BackgroundGate
from salon.engine.core.engine_core import EngineCore, LoadSnapshot
from salon.engine.core.output import FinalStats, RequestEvent
from salon.engine.prefix.hit import PrefixHit
from salon.engine.request import FinishReason, Request, RequestId

log = get_logger(__name__)
# Linux nice values run from -20 to 19: an increment above 19 always ends at 19.
MAX_NICE_INCREMENT = 19


class CommandKind(enum.Enum):
    ADD = "add"  # queue `request` (with `host_hit`, KV the kvstore gave for it)
    ABORT = "abort"  # end `request_id`
    PURGE = "purge"  # erase conversation `request_id` of `namespace`; answer on `done`
    WAKE = "wake"  # nothing: lets a blocked wait see that the loop is stopping


# Steps that raise one after another before the loop gives up (a step error that fails only its own
# requests is a fault; the same error every step is a broken engine).
MAX_CONSECUTIVE_STEP_FAILURES = 3


class EngineDead(RuntimeError):
    """The step thread has stopped for good: the process is about to exit."""


@dataclass(frozen=True)
class Command:
    kind: CommandKind
    request: Request | None = None
    host_hit: PrefixHit | None = None
    request_id: str = ""
    # ADD: a request whose computed prompt the new one repeats (its KV is copied, EngineCore.add).
    prefill_from: RequestId | None = None
    namespace: bytes | None = None
    done: asyncio.Future | None = None


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
    def __init__(
        self,
        core: EngineCore,
        loop: asyncio.AbstractEventLoop,
        on_fatal: Callable[[str], None] | None = None,
        step_nice: int = 0,
    ) -> None:
        if not 0 <= step_nice <= MAX_NICE_INCREMENT:
            raise ValueError(f"step_nice must be 0..{MAX_NICE_INCREMENT} (a nice increment), got {step_nice}")
        self.core = core
        # Added to the step thread's nice value when it starts (0: unchanged); see lower_step_priority.
        self.step_nice = step_nice
        self._loop = loop
        # Called on the event loop when the step thread cannot go on (the service exits).
        self.on_fatal = on_fatal
        self.dead: str | None = None
        self._consecutive_failures = 0
        self._commands: queue.Queue[Command] = queue.Queue()
        self._streams: dict[str, asyncio.Queue] = {}  # event loop side only
        # Event loop side: submitted, not yet in a published load snapshot (num_waiting counts them).
        self._pending_admissions = 0
        self._added_since_publish = 0  # step thread side: ADD commands applied since the last snapshot
        # Step thread side: what the commands and expiries of this turn of the loop answer (their events, a purge's
        # result), done once the load that no longer counts their requests is published (_release_held): a client
        # whose waiting request was aborted must not find it still counted against the queue.
        self._held: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-step-loop", daemon=True)
        self._rate = _TokenRate()
        self.load: LoadSnapshot = core.load()
        # Held off the cores while the model computes (background.py); set before start().
        self.background: BackgroundGate | None = None

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

    def submit(
        self, request: Request, host_hit: PrefixHit | None = None, prefill_from: RequestId | None = None
    ) -> asyncio.Queue:
        """Hand a request to the step thread; its events arrive on the returned queue. prefill_from: a
        request whose computed prompt this one repeats (EngineCore.add)."""
        if self.dead is not None:
            raise EngineDead(self.dead)
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

    async def purge(self, namespace: bytes | None, conversation_id: str) -> tuple[int, int]:
        """Erase a dialogue on the step thread: (requests ended, device blocks freed)."""
        if self.dead is not None:
            raise EngineDead(self.dead)
        done = self._loop.create_future()
        self._commands.put(Command(CommandKind.PURGE, request_id=conversation_id, namespace=namespace, done=done))
        return await done

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

    def _admitted(self, num_requests: int) -> None:
        self._pending_admissions -= num_requests

    # ---- step thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        reason = "the engine step thread ended"
        lower_step_priority(self.step_nice)
        try:
            while not self._stop.is_set():
                try:
                    if self.background is not None and not self.core.has_work():
                        self.background.idle()
                    self._drain_commands(block=not self.core.has_work())
                    self._expire_deadlines()
                    if self._held:  # answered now, not after the step, once the load no longer counts them
                        self._publish()
                        self._release_held()
                    if self.core.has_work():
                        if self.background is not None:
                            self.background.computing()
                        self._step()  # publishes before it sends the step's events
                        self._consecutive_failures = 0
                    else:
                        self._publish()
                except Exception as exc:  # a failed step fails its own requests; the loop goes on
                    log.error("engine_step_failed", error=traceback.format_exc())
                    self._release_held()
                    error = f"internal error in the engine step ({type(exc).__name__})"
                    failed = self.core.fail(self.core.in_step, error)
                    for event in failed:
                        self._send(event)
                    self._consecutive_failures += 1
                    if (
                        isinstance(exc, MemoryError)
                        or "CUDA" in str(exc)
                        or not failed
                        or self._consecutive_failures >= MAX_CONSECUTIVE_STEP_FAILURES
                    ):
                        reason = f"the engine step cannot go on: {type(exc).__name__}: {exc}"
                        return
        except BaseException as exc:  # noqa: BLE001 - reported below; the process exits
            reason = f"the engine step thread died: {type(exc).__name__}: {exc}"
        finally:
            if not self._stop.is_set():
                self._die(reason)

    def _die(self, reason: str) -> None:
        """Fail everything and hand the process over to its supervisor (step thread)."""
        self.dead = reason
        try:
            self._release_held()
            for event in self.core.fail_all("the engine is restarting"):
                self._send(event)
        except Exception:  # noqa: BLE001 - the process exits anyway
            log.error("engine_fail_all_failed", error=traceback.format_exc())
        log.error("engine_step_dead", reason=reason)
        if self.on_fatal is not None:
            self._loop.call_soon_threadsafe(self.on_fatal, reason)

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
        """Carry out one command; a command that fails fails only its own request or caller."""
        try:
            self._apply_one(command)
        except Exception as exc:  # noqa: BLE001 - answered to whoever sent the command
            log.error("engine_command_failed", kind=command.kind.value, error=traceback.format_exc())
            if command.done is not None:
                self._loop.call_soon_threadsafe(_settle, command.done, None, exc)
            elif command.kind is CommandKind.ADD and command.request is not None:
                self._hold_event(
                    RequestEvent(
                        command.request.request_id,
                        [],
                        [],
                        "",
                        FinishReason.ERROR,
                        error=f"could not queue the request ({type(exc).__name__})",
                    )
                )

    def _apply_one(self, command: Command) -> None:
        if command.kind is CommandKind.ADD:
            assert command.request is not None
            self._added_since_publish += 1  # counted as pending until a snapshot shows it (_publish)
            metrics.PROMPT_TOKENS.inc(command.request.num_prompt_tokens)
            self.core.add(command.request, command.host_hit, command.prefill_from)
        elif command.kind is CommandKind.ABORT:
            event = self.core.abort(command.request_id, FinishReason.ABORTED)
            if event is not None:
                self._hold_event(event)
        elif command.kind is CommandKind.PURGE:
            assert command.done is not None
            events, freed = self.core.purge_conversation(command.namespace, command.request_id)
            for event in events:
                self._hold_event(event)
            done, result = command.done, (len(events), freed)
            self._held.append(lambda: self._loop.call_soon_threadsafe(_settle, done, result, None))

    def _expire_deadlines(self) -> None:
        for request_id in self.core.expired(time.monotonic()):
            event = self.core.abort(request_id, FinishReason.ABORTED, error="deadline exceeded")
            if event is not None:
                self._hold_event(event)

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
            if stats.num_draft_tokens:
                metrics.SPEC_DRAFT_TOKENS.inc(stats.num_draft_tokens)
                metrics.SPEC_ACCEPTED_TOKENS.inc(stats.num_accepted_draft_tokens)
            self._rate.add(now, stats.num_sampled)
        # The load first: a client that got a token of a request just scheduled must find that request counted
        # as running, not still as waiting (its admission pending), or a full queue would refuse its next one.
        self._publish()
        for event in events:
            if event.inter_token_s is not None:
                metrics.INTER_TOKEN_LATENCY.observe(event.inter_token_s)
            final = event.final
            if final is not None:
                _observe_final(final)
            self._send(event)

    def _hold_event(self, event: RequestEvent) -> None:
        self._held.append(lambda: self._send(event))

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for answer in held:
            answer()

    def _send(self, event: RequestEvent) -> None:
        if event.finish_reason is not None:
            metrics.REQUEST_SUCCESS.labels(metrics.VLLM_FINISHED_REASONS[event.finish_reason.value]).inc()
        self._loop.call_soon_threadsafe(self._deliver, event)

    def _publish(self) -> None:
        snap = self.core.load(self._rate.rate(time.monotonic()))
        self.load = snap  # one reference assignment: readers see a whole snapshot
        if self._added_since_publish:
            # Only now do the requests added since the last snapshot stop counting as pending: until this
            # snapshot they were in neither count, and the queue bound (num_waiting) would miss them.
            self._loop.call_soon_threadsafe(self._admitted, self._added_since_publish)
            self._added_since_publish = 0
        metrics.NUM_REQUESTS_RUNNING.set(snap.running_requests)
        metrics.NUM_REQUESTS_WAITING.set(snap.waiting_requests)
        metrics.KV_BLOCKS_FREE.set(snap.free_kv_blocks)
        metrics.KV_BLOCKS_CACHED.set(snap.cached_kv_blocks)
        used_blocks = snap.total_kv_blocks - snap.free_kv_blocks - snap.cached_kv_blocks
        metrics.KV_BLOCKS_USED.set(used_blocks)
        metrics.KV_CACHE_USAGE.set(used_blocks / snap.total_kv_blocks if snap.total_kv_blocks else 0.0)
        metrics.DECODE_TOKENS_PER_SECOND.set(snap.decode_tokens_per_s)


def _observe_final(final: FinalStats) -> None:
    """A finished request's latencies and sizes, split into vLLM's phases (metrics.py)."""
    queue_s, ttft_s, total_s = final.queue_ms / 1000.0, final.ttft_ms / 1000.0, final.total_ms / 1000.0
    metrics.TIME_TO_FIRST_TOKEN.observe(ttft_s)
    metrics.REQUEST_QUEUE_TIME.observe(queue_s)
    metrics.REQUEST_PREFILL_TIME.observe(max(0.0, ttft_s - queue_s))
    metrics.REQUEST_DECODE_TIME.observe(max(0.0, total_s - ttft_s))
    metrics.REQUEST_INFERENCE_TIME.observe(max(0.0, total_s - queue_s))
    metrics.E2E_REQUEST_LATENCY.observe(total_s)
    if final.generated_tokens > 1:
        metrics.REQUEST_TIME_PER_OUTPUT_TOKEN.observe(final.itl_ms_mean / 1000.0)
    metrics.REQUEST_PROMPT_TOKENS.observe(final.prompt_tokens)
    metrics.REQUEST_GENERATION_TOKENS.observe(final.generated_tokens)


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def lower_step_priority(increment: int) -> None:
    """Raise the calling thread's nice value by `increment` (Linux: nice is per thread, and the kernel threads
    it starts later, OpenMP's workers, inherit it). The step thread computes for as long as it has work; on
    cores it shares with the event loop, the gateway and the kvstore, a higher nice value lets those run as
    soon as they have work (a request to accept, a token to deliver) instead of waiting out the step's time
    slice. Raising it needs no privilege; where it fails the thread keeps its priority (logged)."""
    if increment <= 0:
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + increment)
    except (OSError, AttributeError) as exc:
        log.warning("step_priority_unchanged", increment=increment, error=str(exc))
