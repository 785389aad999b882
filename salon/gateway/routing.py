"""Routing: which engine serves the next turn of a dialogue.

A dialogue is known by its DialogueKey (`<tenant_id>/<conversation_id>`, see types.py).

Dialogues without a conversation id (stateless clients: the OpenAI HTTP API):

    conversation id = the `x-salon-conversation-id` header when the client sends one, else
                      "~opening/" + hex(the chained block hash of the dialogue's *opening*)
    opening         = for a chat: the system/character block (the leading system and developer
                      messages) and the first user message, rendered as role-tagged, length-
                      prefixed UTF-8; for a text completion: the prompt's text (or its token ids,
                      4 bytes each); in both cases cut to OPENING_MAX_BYTES
    hash            = salon/common/prefix_hash.chain_hash over 64-byte blocks of the opening,
                      chained under the tenant's namespace salt; the last block's hash names it

    Every turn of a dialogue re-sends its opening unchanged, so a stateless client's turns share one
    key: the session table and the ring send them to the engine that holds the dialogue's KV (llm-d's
    "precise prefix-cache routing", for the price of hashing at most OPENING_MAX_BYTES per request).
    Dialogues that open differently hash apart and spread over the ring. Two dialogues with the same
    opening share an engine, which is what their common prefix wants anyway.

    OPENING_MAX_BYTES      2048  how much of the opening is hashed (`--opening-max-bytes`). Smaller
                                 groups more dialogues whose openings agree that far (a shared long
                                 character definition puts all its dialogues on one engine, bounded by
                                 LOAD_FACTOR); 0 turns prefix routing off: each stateless request
                                 is placed alone (least loaded of the ring order of a random key).

Decision rule (BoundedLoadPolicy, consistent hashing with bounded loads):

    eligible  = engines that are SERVING, reporting (load reports not stale, membership.py), not
                draining, and not excluded for this request (the ring is built over those accepting
                engines; per-request exclusions, e.g. the engine a stream just failed on, are
                skipped while walking it)
    load(e)   = max(gateway's own in-flight streams to e, e's last LoadReport running + waiting)
                (the in-flight count is fresh; the report adds what other gateway replicas sent)
    capacity  = max(MIN_CAPACITY, ceil(LOAD_FACTOR * (sum of load(e) over eligible + 1) / len(eligible)))
                (the +1 is the request being placed)
    candidates, in order:
        1. the dialogue's sticky engine from the session table, if eligible
        2. the engines of ring.preference(dialogue_key): ring owner first, then clockwise
    choose the first candidate with load(e) < capacity and not saturated.

    Because min load <= mean load < capacity, some eligible engine is always below capacity, so the
    walk always ends. If every candidate is saturated (its queue is at the engine's hard limit) the
    first candidate below capacity is used anyway and the engine answers RESOURCE_EXHAUSTED.

Knobs:
    LOAD_FACTOR (c)        1.25  how far above the mean an engine may go before its dialogues spill to
                                 the next engine on the ring. Smaller: tighter balance, more cache
                                 misses from spills; larger: stickier, hotter engines. c -> inf is
                                 pure consistent hashing; c = 1 forces near-perfect balance.
    MIN_CAPACITY           8     below this many active streams an engine never counts as full. With
                                 continuous batching a few more streams cost an engine little, while a
                                 spill costs the dialogue its cached prefix; without the floor, at low
                                 load (capacity ceil(1.25 * 2 / 3) = 1) one stream would push the next
                                 turn of a dialogue away. 1 gives the textbook rule.
    VNODES_PER_ENGINE      160   ring points per engine (see ring.py); more points = smoother split
                                 (std-dev of the share ~ 1/sqrt(vnodes)), slower rebuilds.
    saturated              from LoadReport: waiting_requests >= max_waiting_requests (engine would
                                 refuse); such engines are skipped like full ones.

Outcomes (counted in metrics): sticky hit (the session's engine served it), move (the session named
another engine that is gone or full), home (no session; ring owner served it), spill (a candidate
was skipped for load).

Other policies implement `RoutingPolicy`: `choose` gets a snapshot of engine loads and returns a
`RouteDecision` (or None when no engine is eligible); it holds no references to live state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from salon.common.prefix_hash import ROOT_PARENT, chain_hash
from salon.gateway.ring import DEFAULT_VNODES_PER_ENGINE, HashRing
from salon.gateway.types import DialogueKey, EngineId

LOAD_FACTOR = 1.25
MIN_CAPACITY = 8
VNODES_PER_ENGINE = DEFAULT_VNODES_PER_ENGINE
OPENING_MAX_BYTES = 2048
OPENING_BLOCK_BYTES = 64
OPENING_CONVERSATION_PREFIX = "~opening/"


def opening_conversation_id(namespace_salt: str, opening: bytes, max_bytes: int = OPENING_MAX_BYTES) -> str | None:
    """The conversation id of a dialogue that brought none: the chained hash of its opening (see above);
    None when prefix routing is off (max_bytes 0) or the opening is empty."""
    opening = opening[:max_bytes]
    if not opening:
        return None
    namespace = namespace_salt.encode("utf-8")
    parent = ROOT_PARENT
    for start in range(0, len(opening), OPENING_BLOCK_BYTES):
        parent = chain_hash(namespace, parent, opening[start : start + OPENING_BLOCK_BYTES])
    return OPENING_CONVERSATION_PREFIX + parent.hex()


def render_opening(parts: list[tuple[str, str]]) -> bytes:
    """(role, text) pieces as role-tagged, length-prefixed UTF-8 (unambiguous: no two lists agree)."""
    out = bytearray()
    for role, text in parts:
        for field in (role, text):
            data = field.encode("utf-8")
            out += len(data).to_bytes(4, "little") + data
    return bytes(out)


@dataclass(frozen=True)
class EngineLoad:
    """One engine as the router sees it at one moment."""

    engine_id: EngineId
    # Streams counted against this engine (see module docstring for how it is estimated).
    num_active_requests: int
    # SERVING, reporting and not draining: a member of the ring.
    accepting: bool = True
    # The engine's queue is full; it would refuse a new request.
    saturated: bool = False


@dataclass(frozen=True)
class RouteDecision:
    engine_id: EngineId
    # The session table named this engine and it was chosen.
    sticky_hit: bool
    # The session table named a different engine (gone, excluded, or full).
    moved: bool
    # At least one candidate ahead of the chosen one was skipped because it was full.
    spilled: bool
    # Ring owner of the dialogue among eligible engines (None only on an empty ring).
    ring_owner: EngineId | None


class RoutingPolicy(Protocol):
    name: str

    def choose(
        self,
        dialogue_key: DialogueKey,
        engines: Mapping[EngineId, EngineLoad],
        sticky_engine: EngineId | None,
        exclude: frozenset[EngineId] = frozenset(),
    ) -> RouteDecision | None: ...


def bounded_capacity(total_load: int, num_engines: int, load_factor: float, min_capacity: int = 1) -> int:
    """Streams an engine may hold before it counts as full (see module docstring)."""
    return max(min_capacity, math.ceil(load_factor * (total_load + 1) / num_engines))


class BoundedLoadPolicy:
    """Consistent hashing with bounded loads; the ring is rebuilt only when the member set changes."""

    name = "bounded_load"

    def __init__(
        self,
        load_factor: float = LOAD_FACTOR,
        min_capacity: int = MIN_CAPACITY,
        vnodes_per_engine: int = VNODES_PER_ENGINE,
    ):
        if load_factor < 1.0:
            raise ValueError("load_factor must be >= 1.0 (below 1 no placement can satisfy the bound)")
        if min_capacity < 1:
            raise ValueError("min_capacity must be >= 1")
        self.load_factor = load_factor
        self.min_capacity = min_capacity
        self.vnodes_per_engine = vnodes_per_engine
        self._ring = HashRing((), vnodes_per_engine)

    def ring_for(self, member_ids: frozenset[EngineId]) -> HashRing:
        if member_ids != self._ring.engine_ids:
            self._ring = HashRing(member_ids, self.vnodes_per_engine)
        return self._ring

    def choose(
        self,
        dialogue_key: DialogueKey,
        engines: Mapping[EngineId, EngineLoad],
        sticky_engine: EngineId | None,
        exclude: frozenset[EngineId] = frozenset(),
    ) -> RouteDecision | None:
        ring = self.ring_for(frozenset(e for e, load in engines.items() if load.accepting))
        eligible = [e for e in ring.engine_ids if e not in exclude]
        if not eligible:
            return None
        total_load = sum(engines[e].num_active_requests for e in eligible)
        capacity = bounded_capacity(total_load, len(eligible), self.load_factor, self.min_capacity)

        candidates: list[EngineId] = []
        if sticky_engine is not None and sticky_engine in ring.engine_ids and sticky_engine not in exclude:
            candidates.append(sticky_engine)
        ring_owner: EngineId | None = None
        for engine_id in ring.preference(dialogue_key):
            if engine_id in exclude:
                continue
            if ring_owner is None:
                ring_owner = engine_id
            if engine_id != sticky_engine:
                candidates.append(engine_id)

        below_capacity = [e for e in candidates if engines[e].num_active_requests < capacity]
        chosen = next((e for e in below_capacity if not engines[e].saturated), None)
        if chosen is None:
            chosen = below_capacity[0]  # non-empty: min load <= mean < capacity
        return RouteDecision(
            engine_id=chosen,
            sticky_hit=sticky_engine is not None and chosen == sticky_engine,
            moved=sticky_engine is not None and chosen != sticky_engine,
            # Every candidate is eligible, so skipping the first one can only be for load.
            spilled=chosen != candidates[0],
            ring_owner=ring_owner,
        )


class LeastLoadedPolicy:
    """Ignores stickiness: the eligible engine with the fewest active requests (ties by id)."""

    name = "least_loaded"

    def choose(
        self,
        dialogue_key: DialogueKey,
        engines: Mapping[EngineId, EngineLoad],
        sticky_engine: EngineId | None,
        exclude: frozenset[EngineId] = frozenset(),
    ) -> RouteDecision | None:
        eligible = sorted(
            (load.saturated, load.num_active_requests, e)
            for e, load in engines.items()
            if load.accepting and e not in exclude
        )
        if not eligible:
            return None
        chosen = eligible[0][2]
        return RouteDecision(
            engine_id=chosen,
            sticky_hit=sticky_engine is not None and chosen == sticky_engine,
            moved=sticky_engine is not None and chosen != sticky_engine,
            spilled=False,
            ring_owner=None,
        )


def make_policy(name: str, load_factor: float = LOAD_FACTOR, min_capacity: int = MIN_CAPACITY) -> RoutingPolicy:
    if name == BoundedLoadPolicy.name:
        return BoundedLoadPolicy(load_factor=load_factor, min_capacity=min_capacity)
    if name == LeastLoadedPolicy.name:
        return LeastLoadedPolicy()
    raise ValueError(f"unknown routing policy {name!r} (known: bounded_load, least_loaded)")
