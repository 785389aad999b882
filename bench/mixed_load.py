"""Returning turns under mixed load: one engine core, in process, with cold dialogue histories prefilling while
returning turns (a few new tokens after a device cache hit) arrive, for the engine's scheduler against a FIFO
baseline in the same run.

    python -m bench.mixed_load [--quick] [--model gemma-3-270m] [--threads 1] [--budget 256]
                               [--long-prefill-tokens N] [--long-prefill-solo-tokens N]

The load, the same for both schedulers (contexts of salon/loadgen's dialogue trace, greedy):
  cold       --cold dialogues whose whole history (--cold-tokens) arrives at t = 0, nothing cached;
  returning  --returning dialogues whose previous turn is in the device prefix cache (served before the
             clock starts); each comes back with its new tokens (the last --new-tokens of its context) at
             t = --gap-s, 2 --gap-s, ... while the cold histories prefill.
Every request generates --max-new tokens. The threads default to 1: one engine of `salon up --engines 2`
on a 2-core host.

Schedulers: "engine" is SchedulerConfig with --budget, --long-prefill-tokens and --long-prefill-solo-tokens
(the engine's defaults: interactive requests first, long prefills in arrival order with a capped share
beside them and a capped step of their own); "solo_off" is the same with long_prefill_solo_tokens = 0 (long
prefills alone fill the budget); "fifo" is the same budget with long_prefill_tokens = 0 (every request in
arrival order, each taking what the budget leaves). Per scheduler: the returning turns' TTFT p50 / p90 and
max, the cold turns' TTFT, the inter-token gaps (ITL) p50 / p90 of every stream, and the prompt tokens
computed per second of the run; the engine's figures over each baseline's as ratios. All must produce the
same tokens (greedy, batch-invariant kernels): the run stops if not. Last line: RESULT {json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from bench.speculative import dialogue_prompts
from salon.engine.config import SchedulerConfig
from salon.engine.core.engine_core import EngineCore
from salon.engine.request import Request, RequestId, SamplingParams
from salon.engine.worker.model_loading import load_model
from salon.loadgen.report import percentile

NAMESPACE = b"bench-mixed-load"


def _request(rid: str, ids: list[int], max_new: int) -> Request:
    r = Request(RequestId(rid), list(ids), SamplingParams(max_new_tokens=max_new), frozenset(), 1 << 30)
    r.namespace = NAMESPACE
    return r


def run_load(
    model,
    tok,
    config: SchedulerConfig,
    cold: list[list[int]],
    returning: list[list[int]],
    new_tokens: int,
    gap_s: float,
    max_new: int,
) -> dict:
    """Serve the load on a fresh core; per request its arrival, token times and tokens."""
    core = EngineCore(model, tok, config, 16, 1 << 30)
    for i, ids in enumerate(returning):  # the previous turns, cached before the clock starts
        prior = _request(f"prior-{i}", ids[:-new_tokens], 1)
        core.add(prior)
        while core.has_work():
            core.step()
    arrivals = [(0.0, _request(f"cold-{i}", ids, max_new)) for i, ids in enumerate(cold)]
    arrivals += [((i + 1) * gap_s, _request(f"back-{i}", ids, max_new)) for i, ids in enumerate(returning)]
    arrivals.sort(key=lambda a: a[0])
    times: dict[str, list[float]] = {r.request_id: [] for _, r in arrivals}
    tokens: dict[str, list[int]] = {r.request_id: [] for _, r in arrivals}
    arrived: dict[str, float] = {}
    cached: dict[str, int] = {}
    start = time.monotonic()
    pending = list(arrivals)
    while pending or core.has_work():
        now = time.monotonic() - start
        while pending and pending[0][0] <= now:
            at, request = pending.pop(0)
            arrived[request.request_id] = at
            core.add(request)
        if not core.has_work():
            time.sleep(max(0.0, pending[0][0] - now))
            continue
        events = core.step()
        done = time.monotonic() - start
        for e in events:
            times[e.request_id] += [done] * len(e.token_ids)
            tokens[e.request_id] += e.token_ids
        for _, request in arrivals:
            cached[request.request_id] = request.num_cached_device_tokens + request.num_cached_host_tokens
    wall_s = time.monotonic() - start
    computed = sum(len(r.prompt_token_ids) - cached[r.request_id] for _, r in arrivals)
    return {
        "times": times,
        "tokens": tokens,
        "arrived": arrived,
        "wall_s": wall_s,
        "prompt_tokens_computed": computed,
        "returning_hit_rate": sum(cached[r.request_id] for _, r in arrivals if r.request_id.startswith("back"))
        / sum(len(r.prompt_token_ids) for _, r in arrivals if r.request_id.startswith("back")),
    }


def figures(run: dict) -> dict:
    ttft = {rid: (ts[0] - run["arrived"][rid]) * 1e3 for rid, ts in run["times"].items()}
    back = [v for rid, v in ttft.items() if rid.startswith("back")]
    cold = [v for rid, v in ttft.items() if rid.startswith("cold")]
    gaps = [(b - a) * 1e3 for ts in run["times"].values() for a, b in zip(ts, ts[1:]) if b > a]
    return {
        "ttft_ms_p50_returning": percentile(back, 50),
        "ttft_ms_p90_returning": percentile(back, 90),
        "ttft_ms_max_returning": max(back),
        "ttft_ms_mean_cold": sum(cold) / len(cold),
        "itl_ms_p50": percentile(gaps, 50),
        "itl_ms_p90": percentile(gaps, 90),
        "prompt_tokens_per_s": run["prompt_tokens_computed"] / run["wall_s"],
        "wall_s": run["wall_s"],
        "returning_hit_rate": run["returning_hit_rate"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=int, default=SchedulerConfig.max_num_batched_tokens)
    parser.add_argument("--long-prefill-tokens", type=int, default=SchedulerConfig.long_prefill_tokens)
    parser.add_argument("--long-prefill-solo-tokens", type=int, default=SchedulerConfig.long_prefill_solo_tokens)
    parser.add_argument("--cold", type=int, default=None, help="cold dialogues (quick 2, full 3)")
    parser.add_argument("--cold-tokens", type=int, default=None, help="each cold history (quick 1000, full 1800)")
    parser.add_argument("--returning", type=int, default=None, help="returning turns (quick 4, full 8)")
    parser.add_argument("--new-tokens", type=int, default=48, help="new tokens of a returning turn")
    parser.add_argument("--gap-s", type=float, default=None, help="between returning turns (quick 1.0, full 1.5)")
    parser.add_argument("--max-new", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n_cold = args.cold or (2 if args.quick else 3)
    cold_tokens = args.cold_tokens or (1000 if args.quick else 1800)
    n_back = args.returning or (4 if args.quick else 8)
    gap_s = args.gap_s or (1.0 if args.quick else 1.5)

    model, tok = load_model(args.model, "int8")
    prompts = dialogue_prompts(tok, n_cold + n_back, cold_tokens)
    cold, returning = prompts[:n_cold], prompts[n_cold:]
    engine = SchedulerConfig(
        args.budget,
        long_prefill_tokens=args.long_prefill_tokens,
        long_prefill_solo_tokens=args.long_prefill_solo_tokens,
    )
    configs = {
        "engine": engine,
        "solo_off": dataclasses.replace(engine, long_prefill_solo_tokens=0),
        "fifo": SchedulerConfig(args.budget, long_prefill_tokens=0),
    }
    print(
        f"threads {args.threads}; {n_cold} cold histories of {cold_tokens} tokens at t = 0, {n_back} returning "
        f"turns of {args.new_tokens} new tokens every {gap_s} s, {args.max_new} new tokens each; budget "
        f"{args.budget}, long_prefill_tokens {args.long_prefill_tokens} (fifo: 0), long_prefill_solo_tokens "
        f"{args.long_prefill_solo_tokens} (solo_off: 0)",
        flush=True,
    )
    runs = {
        name: run_load(model, tok, config, cold, returning, args.new_tokens, gap_s, args.max_new)
        for name, config in configs.items()
    }
    if any(run["tokens"] != runs["engine"]["tokens"] for run in runs.values()):
        raise SystemExit("the schedulers produced different tokens")
    result: dict = {
        "threads": args.threads,
        "budget": args.budget,
        "long_prefill_tokens": args.long_prefill_tokens,
        "long_prefill_solo_tokens": args.long_prefill_solo_tokens,
        "cold": n_cold,
        "cold_tokens": cold_tokens,
        "returning": n_back,
        "new_tokens": args.new_tokens,
    }
    table = {name: figures(run) for name, run in runs.items()}
    baselines = [name for name in configs if name != "engine"]
    print(f"{'figure':28s} {'engine':>10s}" + "".join(f" {b:>10s} {'engine/' + b:>16s}" for b in baselines))
    for key in table["engine"]:
        a = table["engine"][key]
        result[key] = round(a, 3)
        line = f"{key:28s} {a:10.1f}"
        for base in baselines:
            b = table[base][key]
            ratio = a / b if b else None
            line += f" {b:10.1f} {'' if ratio is None else f'{ratio:15.2f}x'}"
            result[f"{key}_{base}"] = round(b, 3)
            if ratio is not None:
                result[f"{key}_over_{base}_x"] = round(ratio, 3)
        print(line)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
