"""`salon bench`: replay a Character.AI-style dialogue workload through the gateway.

Against a running stack:   salon bench --target 127.0.0.1:50051 --api-key KEY
Starting its own stack:    salon bench --launch [--model synthetic-tiny] [--engines 2] [--compare-no-cache]

Default trace (the Character.AI shape, sized so it finishes on a small CPU box with gemma-3-270m):
8 dialogues (4 at t=0, the rest arriving at 0.5/s), each with a pre-built history of mean 180
messages (gamma, user ~10 words, character ~20 words; about 4,300 Gemma tokens), 4 turns each with
short replies (24 new tokens, temperature 0.7, top_p 0.95, seeded), think time mean 1 s, 10% of
pauses "away" (mean 8 s), 10% regenerations and 5% edits of the last message; 8 streams at once.
Histories are primed: before the clock starts each dialogue's previous session's last turn is
served once (unmeasured; skipped without a cache), so measured turns are returning users, as in a
product where every history message went through the service (--no-prime: first turns run cold).
A launched stack (--launch) runs kvstore + N engines + gateway; --no-cache launches no kvstore and
engines with --no-prefix-cache true. --compare-no-cache replays the same trace on both and prints ratios.
--quick: 3 dialogues x 3 turns, one with a 200-message history (>= 4,000 tokens with the Gemma
tokenizer when the model's context allows), the others 16 messages; 12 new tokens; short pauses.
Every knob has a flag; flags override the chosen preset.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import grpc

from bench.loadgen.driver import DriverConfig, replay
from bench.loadgen.records import RunResult, TurnRecord
from bench.loadgen.report import DEFAULT_LONG_HISTORY_TOKENS, compare, hit_rate, summarize
from bench.loadgen.workload import Trace, WorkloadConfig, generate_trace

QUICK = WorkloadConfig(
    num_dialogues=3, num_initial_dialogues=3, turns_per_dialogue=3, history_messages_mean=16.0,
    num_long_dialogues=1, long_history_messages=200, max_new_tokens=12, think_s_mean=0.2, away_fraction=0.0,
    regenerate_fraction=0.15, edit_fraction=0.15,
)

# flag name -> WorkloadConfig field
_WORKLOAD_FLAGS = {
    "seed": "seed", "dialogues": "num_dialogues", "initial_dialogues": "num_initial_dialogues",
    "arrival_rate": "arrival_rate_per_s", "turns": "turns_per_dialogue", "history_messages": "history_messages_mean",
    "min_history_messages": "history_messages_min", "long_dialogues": "num_long_dialogues",
    "long_history_messages": "long_history_messages", "user_words": "user_words_mean",
    "character_words": "character_words_mean", "definition_words": "definition_words",
    "regenerate_fraction": "regenerate_fraction", "edit_fraction": "edit_fraction", "think_s": "think_s_mean",
    "away_fraction": "away_fraction", "away_s": "away_s_mean", "max_new_tokens": "max_new_tokens",
    "temperature": "temperature", "top_p": "top_p",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="salon bench", description=__doc__.splitlines()[0],
                                epilog="\n".join(__doc__.splitlines()[2:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_argument_group("stack")
    where.add_argument("--target", default="127.0.0.1:50051", help="gateway host:port (without --launch)")
    where.add_argument("--api-key", default="salon-dev-key", help="tenant API key (without --launch)")
    where.add_argument("--launch", action="store_true", help="start kvstore + engines + gateway for the run")
    where.add_argument("--model", default="gemma-3-270m", help="model of a launched stack (or synthetic-tiny)")
    where.add_argument("--engines", type=int, default=2, help="engines of a launched stack")
    where.add_argument("--no-kvstore", action="store_true",
                       help="launched stack without a kvstore: only the engines' own prefix caches")
    where.add_argument("--kvstore-capacity-bytes", type=int, default=1 << 30, help="kvstore of a launched stack")
    where.add_argument("--engine-arg", action="append", default=[], help="extra flag for launched engines")
    where.add_argument("--startup-timeout-s", type=float, default=1800.0,
                       help="longest wait for each launched service to serve (first model conversion is slow)")
    where.add_argument("--log-dir", type=Path, default=None, help="logs of a launched stack (default: temp dir)")
    mode = p.add_argument_group("mode")
    mode.add_argument("--no-cache", action="store_true",
                      help="run without any cache (launched: no kvstore, engines with --no-prefix-cache true)")
    mode.add_argument("--compare-no-cache", action="store_true", help="run with and without cache (needs --launch)")
    mode.add_argument("--quick", action="store_true", help="the small trace (minutes with the real model)")
    mode.add_argument("--concurrency", type=int, default=8, help="Generate streams open at once")
    mode.add_argument("--time-scale", type=float, default=1.0, help="multiplies think times and arrivals (0: none)")
    mode.add_argument("--long-history-tokens", type=int, default=DEFAULT_LONG_HISTORY_TOKENS)
    mode.add_argument("--request-timeout-s", type=float, default=600.0)
    mode.add_argument("--no-progress", action="store_true", help="no progress bar")
    out = p.add_argument_group("output")
    out.add_argument("--json", type=Path, default=None, help="write the full report here")
    out.add_argument("--plot", type=Path, default=None, help="write the PNG plot here")
    load = p.add_argument_group("workload (defaults: see above)")
    load.add_argument("--no-prime", action="store_true",
                      help="do not serve each history once before the clock starts (first turns run cold)")
    types = {f.name: f.type for f in dataclasses.fields(WorkloadConfig)}
    for flag, name in _WORKLOAD_FLAGS.items():
        kind = {"int": int, "float": float}[types[name] if isinstance(types[name], str) else types[name].__name__]
        load.add_argument("--" + flag.replace("_", "-"), dest=flag, type=kind, default=None, help=name)
    return p


def workload_config(args: argparse.Namespace) -> WorkloadConfig:
    base = QUICK if args.quick else WorkloadConfig()
    overrides = {name: getattr(args, flag) for flag, name in _WORKLOAD_FLAGS.items() if getattr(args, flag) is not None}
    if args.no_prime:
        overrides["prime_history"] = False
    return dataclasses.replace(base, **overrides)


def _progress(label: str, total: int, disabled: bool):
    from tqdm import tqdm

    bar = tqdm(total=total, desc=f"bench [{label}]", unit="turn", file=sys.stderr, disable=disabled)
    seen: list[TurnRecord] = []

    def on_turn(record: TurnRecord) -> None:
        seen.append(record)
        rate = hit_rate(seen)
        bar.set_postfix(hit_rate="-" if rate is None else f"{rate:.3f}",
                        errors=sum(not r.ok for r in seen), refresh=False)
        bar.update(1)

    return bar, on_turn


def run_once(trace: Trace, args: argparse.Namespace, cache: bool, log_dir: Path) -> RunResult:
    label = "cache" if cache else "no-cache"
    stack = None
    target, api_key = args.target, args.api_key
    if args.launch:
        from bench.loadgen.stack import StackConfig, launch_stack

        config = StackConfig(model=args.model, num_engines=args.engines, cache=cache,
                             kvstore=cache and not args.no_kvstore, engine_args=tuple(args.engine_arg),
                             kvstore_capacity_bytes=args.kvstore_capacity_bytes,
                             engine_timeout_s=args.startup_timeout_s)
        print(f"starting {label} stack: {args.engines} engine(s) of {args.model}, logs in {log_dir}", flush=True)
        stack = launch_stack(config, log_dir)
        target, api_key = stack.gateway_address, config.api_key
    bar, on_turn = _progress(label, trace.num_turns, args.no_progress)
    try:
        # Priming fills a cache; without one it would only cost time, so the no-cache run skips it.
        driver = DriverConfig(target, api_key, args.concurrency, args.time_scale, args.request_timeout_s,
                              prime=cache)
        return asyncio.run(replay(trace, driver, label, on_turn))
    finally:
        bar.close()
        if stack is not None:
            stack.stop()


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def describe(summary: dict) -> str:
    return "\n".join([
        f"[{summary['label']}] {summary['num_turns']} turns ({summary['num_errors']} errors) in "
        f"{summary['wall_s']:.1f} s, model {summary['model_id']}, kinds {summary['turn_kinds']}"
        + (f"; histories primed in {summary['prime_wall_s']:.1f} s ({len(summary['prime_errors'])} errors)"
           if summary["primed"] else "; not primed"),
        f"  token hit rate {_fmt(summary['token_hit_rate'], 4)} (device {summary['cached_device_tokens']}, "
        f"host {summary['cached_host_tokens']} of {summary['prompt_tokens']} prompt tokens); "
        f"warm turns {_fmt(summary['token_hit_rate_warm_turns'], 4)}",
        f"  TTFT ms p50 {_fmt(summary['ttft_ms_p50'])} p90 {_fmt(summary['ttft_ms_p90'])} "
        f"p99 {_fmt(summary['ttft_ms_p99'])}; ITL ms p50 {_fmt(summary['itl_ms_p50'])} "
        f"p90 {_fmt(summary['itl_ms_p90'])}",
        f"  {summary['turns_per_s']:.3f} turns/s, {summary['tokens_per_s']:.2f} generated tokens/s, "
        f"{summary['prompt_tokens_per_s']:.0f} prompt tokens/s; per engine {summary['engine_turns']}",
        *[f"  error: {err} x{n}" for err, n in summary["errors"]],
    ])


def result_line(main: dict, comparison: dict | None, other: dict | None) -> dict:
    keys = ("token_hit_rate", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p90",
            "turns_per_s", "tokens_per_s", "num_turns", "num_errors", "wall_s")
    result = {"mode": main["label"], "model_id": main["model_id"], **{k: main[k] for k in keys}}
    if comparison is not None and other is not None:
        result.update({k: comparison[k] for k in ("ttft_ratio_long_history", "turns_per_s_ratio",
                                                  "ttft_ratio_warm_turns", "num_long_history_turns",
                                                  "replies_identical_fraction")})
        result.update({"no_cache_ttft_ms_p50": other["ttft_ms_p50"], "no_cache_turns_per_s": other["turns_per_s"],
                       "no_cache_num_errors": other["num_errors"]})
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.compare_no_cache and not args.launch:
        print("salon bench: --compare-no-cache needs --launch (it starts a stack with and one without cache)",
              file=sys.stderr)
        return 2
    if args.compare_no_cache and args.no_cache:
        print("salon bench: choose one of --no-cache and --compare-no-cache", file=sys.stderr)
        return 2
    try:
        config = workload_config(args)
    except ValueError as exc:
        print(f"salon bench: bad workload: {exc}", file=sys.stderr)
        return 2
    trace = generate_trace(config)
    print(f"trace: seed {config.seed}, {len(trace.dialogues)} dialogues, {trace.num_turns} turns, "
          f"{sum(len(d.history) for d in trace.dialogues) / len(trace.dialogues):.1f} history messages on average",
          flush=True)
    # Logs of a launched stack are kept after the run (printed at start); nothing is created without --launch.
    log_dir = args.log_dir or (Path(tempfile.mkdtemp(prefix="salon-bench-")) if args.launch else Path("."))
    modes = [True, False] if args.compare_no_cache else [not args.no_cache]
    from services.common.process import ServiceStartError

    runs: dict[str, RunResult] = {}
    try:
        for cache in modes:
            run = run_once(trace, args, cache, log_dir)
            runs[run.label] = run
    except ServiceStartError as exc:
        print(f"salon bench: the stack did not start: {exc}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:  # GetModelInfo failed: wrong target or key
        print(f"salon bench: the gateway refused or is unreachable: {exc.code().name}: {exc.details()}",
              file=sys.stderr)
        return 1
    summaries = {label: summarize(run, args.long_history_tokens) for label, run in runs.items()}
    for summary in summaries.values():
        print(describe(summary))
    comparison = None
    if args.compare_no_cache:
        comparison = compare(runs["cache"], runs["no-cache"], args.long_history_tokens)
        print(f"compare: TTFT ratio (no cache / cache) over {comparison['num_long_history_turns']} warm turns with "
              f">= {args.long_history_tokens} prompt tokens: {_fmt(comparison['ttft_ratio_long_history'], 2)} "
              f"(medians {_fmt(comparison['ttft_ms_median_long_history_no_cache'])} ms / "
              f"{_fmt(comparison['ttft_ms_median_long_history_cache'])} ms); all warm turns "
              f"{_fmt(comparison['ttft_ratio_warm_turns'], 2)}; turns/s ratio "
              f"{_fmt(comparison['turns_per_s_ratio'], 2)}; identical replies "
              f"{_fmt(comparison['replies_identical_fraction'], 3)}")
    main_label = next(iter(runs))
    other = summaries.get("no-cache") if args.compare_no_cache else None
    result = result_line(summaries[main_label], comparison, other)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "workload": dataclasses.asdict(config), "launch": args.launch, "model": args.model if args.launch else None,
            "engines": args.engines if args.launch else None, "concurrency": args.concurrency,
            "time_scale": args.time_scale, "runs": summaries, "compare": comparison, "result": result,
            "records": {label: [dataclasses.asdict(r) for r in run.records] for label, run in runs.items()},
        }, indent=1, default=str))
        print(f"report: {args.json}")
    if args.plot is not None:
        from bench.loadgen.plot import write_plot

        write_plot(args.plot, runs.get("cache"), runs.get("no-cache"))
        print(f"plot: {args.plot}")
    print("RESULT " + json.dumps(result), flush=True)
    return 1 if all(s["num_errors"] == s["num_turns"] for s in summaries.values()) else 0
