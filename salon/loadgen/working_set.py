"""`salon bench --working-set`: the dialogues' KV outgrows the engines' and the kvstore's memory.

Sizing, from the model's own KV layout (salon/engine/kv/kv_layout.py, kv_transfer.host_layout):

    T_d      tokens dialogue d reaches by its last turn: its first prompt rendered by salon's renderer,
             plus the estimated growth of its turns (dialogue.growth_tokens), at most the context
    blocks(T)  paged blocks one request of T tokens holds at most (KVCacheManager.max_blocks_for_tokens)
    engine KV (--kv-cache-bytes) = ceil(1.25 x concurrency) x blocks(max T_d) x page bytes:
             a full batch of the longest dialogue always fits; finished dialogues compete for the rest
    device working set = sum_d blocks(T_d) x page bytes: what the engines would need to keep them all
    kvstore: the first run gets room for everything -- every block's global and local payloads plus
             room for branches (an upper bound) -- and its GetStats at the end gives the working set W
             actually held (with no eviction). Then one run per fraction f: --capacity-bytes f x W.

Every run launches a fresh stack (empty caches) and replays the same trace, unprimed unless --prime.
The figure is the token hit rate against kvstore capacity, with its device / host split and the
kvstore's eviction counts, as a table and a PNG (plot.write_working_set_plot).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from salon.loadgen.dialogue import DialogueState, growth_tokens
from salon.loadgen.driver import turn_request
from salon.loadgen.workload import Trace

# Dialogues that return in about the order they left meet LRU's cliff: below the capacity their reuse
# distance needs, each tier evicts what is asked for next and the hit rate drops to near zero, so the
# points sit near W, where the curve bends.
DEFAULT_FRACTIONS = (0.75, 0.5, 0.25)
DEFAULT_FRACTIONS_QUICK = (0.75, 0.25)
ENGINE_HEADROOM = 1.25
# The first run's kvstore bound: x the plain block estimate (regenerations and edits add branches), plus 16 MiB.
KVSTORE_BOUND_FACTOR = 1.5


@dataclass(frozen=True)
class WorkingSetPlan:
    max_dialogue_tokens: int
    total_dialogue_tokens: int
    page_bytes: int  # one engine block id (every layer group's slot for 16 tokens)
    engine_kv_cache_bytes: int
    num_engines: int
    device_working_set_bytes: int
    kvstore_bytes_per_block: int  # global + local payload of one block
    kvstore_bound_bytes: int

    @property
    def exceeds_engines(self) -> bool:
        return self.device_working_set_bytes > self.num_engines * self.engine_kv_cache_bytes

    def as_json(self) -> dict:
        return {**dataclasses.asdict(self), "exceeds_engines": self.exceeds_engines}


def dialogue_tokens(trace: Trace, rendering, max_context_tokens: int) -> list[int]:
    """T_d for every dialogue: the first turn's prompt (salon's rendering) + the growth of its turns."""
    out = []
    for spec in trace.dialogues:
        state = DialogueState(spec)
        messages = state.begin_turn(spec.turns[0])
        first = len(rendering.prompt_ids(turn_request(spec, messages, spec.turns[0], 0, trace.config)))
        out.append(min(max_context_tokens, first + growth_tokens(spec, trace.config.max_new_tokens)))
    return out


def plan(
    tokens: Sequence[int],
    model: str,
    num_engines: int,
    concurrency: int,
    block_size_tokens: int = 16,
    max_num_batched_tokens: int = 256,
) -> WorkingSetPlan:
    from salon.engine.kv.kv_cache_manager import KVCacheManager
    from salon.engine.kv.kv_layout import plan_layout
    from salon.engine.kv.kv_transfer import host_layout
    from salon.engine.model.loader import config_for

    config = config_for(model)
    layout = plan_layout(config, block_size_tokens, 1 << 40)
    manager = KVCacheManager(dataclasses.replace(layout, num_blocks=1))
    blocks = [manager.max_blocks_for_tokens(t, max_num_batched_tokens) for t in tokens]
    engine = math.ceil(ENGINE_HEADROOM * concurrency) * max(blocks) * layout.page_bytes
    host = host_layout(layout)
    per_block = host.global_bytes_per_block + host.local_bytes_per_block
    stored_blocks = sum(-(-t // block_size_tokens) for t in tokens)
    bound = int(KVSTORE_BOUND_FACTOR * stored_blocks * per_block) + (16 << 20)
    return WorkingSetPlan(
        max(tokens),
        sum(tokens),
        layout.page_bytes,
        engine,
        num_engines,
        sum(blocks) * layout.page_bytes,
        per_block,
        bound,
    )


def point(summary: dict, stats: dict | None, capacity_bytes: int, working_set_bytes: int | None) -> dict:
    """One row of the table: a run's hit rates at one kvstore capacity, and what the kvstore did."""
    prompt = summary["prompt_tokens"] or 1
    stats = stats or {}
    return {
        "kvstore_capacity_bytes": capacity_bytes,
        "fraction_of_working_set": None if not working_set_bytes else capacity_bytes / working_set_bytes,
        "token_hit_rate": summary["token_hit_rate"],
        "token_hit_rate_warm_turns": summary["token_hit_rate_warm_turns"],
        "device_hit_rate": summary["cached_device_tokens"] / prompt,
        "host_hit_rate": summary["cached_host_tokens"] / prompt,
        "kvstore_used_bytes": stats.get("used_bytes"),
        "kvstore_evicted_blocks": stats.get("evicted_blocks"),
        "kvstore_evicted_local_blocks": stats.get("evicted_local_blocks"),
        "turns_per_s": summary["turns_per_s"],
        "ttft_ms_p50_warm_turns": summary["ttft_ms_p50_warm_turns"],
        "ttft_ms_p90_warm_turns": summary["ttft_ms_p90_warm_turns"],
        "num_errors": summary["num_errors"],
    }


def _mib(num_bytes: int | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / (1 << 20):.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(points: Sequence[dict]) -> str:
    header = (
        f"{'kvstore MiB':>11} {'of W':>6} {'hit rate':>9} {'returning':>9} {'device':>7} {'host':>7} "
        f"{'evicted':>8} {'turns/s':>8} {'TTFT p90 ret. ms':>16}"
    )
    lines = [header]
    for p in points:
        frac = p["fraction_of_working_set"]
        lines.append(
            f"{_mib(p['kvstore_capacity_bytes']):>11} {'-' if frac is None else f'{frac:.3f}':>6} "
            f"{_pct(p['token_hit_rate']):>9} {_pct(p['token_hit_rate_warm_turns']):>9} "
            f"{_pct(p['device_hit_rate']):>7} {_pct(p['host_hit_rate']):>7} "
            f"{'-' if p['kvstore_evicted_blocks'] is None else p['kvstore_evicted_blocks']:>8} "
            f"{p['turns_per_s']:>8.3f} "
            f"{'-' if p['ttft_ms_p90_warm_turns'] is None else format(p['ttft_ms_p90_warm_turns'], '.1f'):>16}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class SweepResult:
    plan: WorkingSetPlan
    working_set_bytes: int | None  # what the kvstore held after the run with room for everything
    first_run_evicted_blocks: int | None
    runs: tuple  # (RunResult, summary dict, point dict) per run, the room-for-all run first


def sweep(
    trace: Trace, side, driver, fractions: Sequence[float], progress, long_history_tokens: int, rendering=None
) -> SweepResult:
    """One fresh stack per kvstore capacity: room for all first (it measures W), then each fraction of W.
    `progress(label, fn)` runs fn(on_turn) with a progress bar; `side` is a runs.SalonSide."""
    from salon.engine.model.loader import config_for
    from salon.loadgen.report import summarize
    from salon.loadgen.runs import load_rendering, run_salon

    rendering = rendering or load_rendering(side.model)
    tokens = dialogue_tokens(trace, rendering, config_for(side.model).max_context_tokens)
    p = plan(tokens, side.model, side.num_engines, driver.concurrency)
    print(
        f"working set: {len(tokens)} dialogues reach {p.total_dialogue_tokens} tokens (longest "
        f"{p.max_dialogue_tokens}); "
        f"their paged KV {_mib(p.device_working_set_bytes)} MiB against {p.num_engines} engine(s) x "
        f"{_mib(p.engine_kv_cache_bytes)} MiB (--kv-cache-bytes {p.engine_kv_cache_bytes}: "
        f"{ENGINE_HEADROOM:g} x {driver.concurrency} streams of the longest dialogue)"
        + ("" if p.exceeds_engines else "; WARNING: it fits the engines, so this is not a working-set run"),
        flush=True,
    )
    engines = f"engines {_mib(p.engine_kv_cache_bytes)} MiB each"
    side = dataclasses.replace(side, engine_kv_cache_bytes=p.engine_kv_cache_bytes)
    runs = []

    def one(capacity: int, detail: str, prefix: str, working_set: int | None):
        run, stats = progress(
            prefix,
            lambda on_turn: run_salon(
                trace,
                dataclasses.replace(side, kvstore_capacity_bytes=capacity),
                True,
                driver,
                on_turn,
                log_prefix=prefix,
                mode_detail=f"working set: {engines}, {detail}",
            ),
        )
        summary = summarize(run, long_history_tokens)
        runs.append((run, summary, point(summary, stats, capacity, working_set)))
        return stats

    stats = one(p.kvstore_bound_bytes, f"kvstore {_mib(p.kvstore_bound_bytes)} MiB (room for all)", "ws-all", None)
    working_set = stats["used_bytes"] if stats else None
    evicted = stats["evicted_blocks"] + stats["evicted_local_blocks"] if stats else None
    if evicted:
        print(f"WARNING: the run with room for all evicted {evicted} payloads: W is a lower bound", flush=True)
    if working_set:
        runs[0][2]["fraction_of_working_set"] = p.kvstore_bound_bytes / working_set
        print(f"working set W: the kvstore held {_mib(working_set)} MiB after the run with room for all", flush=True)
        for f in fractions:
            capacity = max(1, int(f * working_set))
            one(capacity, f"kvstore {_mib(capacity)} MiB ({f:g} W)", f"ws-{f:g}", working_set)
    return SweepResult(p, working_set, evicted, tuple(runs))
