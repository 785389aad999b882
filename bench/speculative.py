"""Speculative decoding (n-gram drafts from the context) on and off, measured in the same run.

    python -m bench.speculative [--quick] [--model gemma-3-270m] [--threads 2] [--speculative-tokens 4]

Two engine cores on one loaded model, identical except --speculative-tokens (0 = the baseline),
run the same requests, alternating which goes first:
  random     bench.engine's batch-1 shape: a prompt of distinct token ids, greedy
  dialogue   batch 1: contexts of the dialogue workload (salon/loadgen's trace: a character
             definition and the history as "Name: text" lines, ending with the character's name),
             sampled as the workload samples (temperature 0.7, top-p 0.95, a seed per turn)
  dialogue4  the same contexts, 4 in flight (the dialogue preset's concurrency)
Per case: decode tokens/s with and without speculation (generated tokens / wall time, prefill
included, the same for both), the speedup, and the acceptance rate (accepted / proposed drafts).
Every request's tokens must be identical with and without speculation; the run stops if not.
Last line: RESULT {json}.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from salon.engine.config import SchedulerConfig
from salon.engine.core.engine_core import EngineCore
from salon.engine.request import Request, RequestId, SamplingParams
from salon.engine.worker.model_loading import load_model
from salon.loadgen.workload import WorkloadConfig, generate_trace


def dialogue_prompts(tok, n: int, max_tokens: int) -> list[list[int]]:
    """The first n dialogues of the workload's trace as plain text contexts (the last max_tokens tokens)."""
    trace = generate_trace(WorkloadConfig(seed=1, num_dialogues=n, history_messages_mean=40.0))
    out = []
    for d in trace.dialogues:
        lines = [f"{d.character_name}: {d.character_definition}"]
        lines += [f"{m.author}: {m.text}" for m in d.history]
        lines.append(f"{d.user_name}: {d.turns[0].user_text or 'Go on.'}")
        ids = tok.encode("\n".join(lines) + f"\n{d.character_name}:", add_bos=False)
        out.append([tok.bos_token_id] + ids[-(max_tokens - 1) :])
    return out


def requests(prompts: list[list[int]], new_tokens: int, tag: str, sampled: bool) -> list[Request]:
    out = []
    for i, ids in enumerate(prompts):
        params = (
            SamplingParams(max_new_tokens=new_tokens, temperature=0.7, top_p=0.95, seed=i)
            if sampled
            else SamplingParams(max_new_tokens=new_tokens)
        )
        out.append(Request(RequestId(f"{tag}-{i}"), list(ids), params, frozenset(), 1 << 30))
    return out


def drive(core: EngineCore, pending: list[Request], max_in_flight: int) -> tuple[dict[str, list[int]], float]:
    pending = list(pending)
    out: dict[str, list[int]] = {}
    in_flight = 0
    start = time.monotonic()
    while pending or in_flight:
        while pending and in_flight < max_in_flight:
            r = pending.pop(0)
            core.add(r)
            out[r.request_id] = []
            in_flight += 1
        for e in core.step():
            out[e.request_id] += e.token_ids
            in_flight -= e.finish_reason is not None
    return out, time.monotonic() - start


def measure(
    cores: dict[int, EngineCore], prompts, new_tokens: int, tag: str, sampled: bool, in_flight: int, rounds: int
) -> dict:
    """Tokens/s per core (best of rounds, the order alternating), acceptance on the speculative one."""
    best = {k: 0.0 for k in cores}
    tokens: dict[int, dict] = {}
    spec_k = max(cores)
    before = (cores[spec_k].num_draft_tokens, cores[spec_k].num_accepted_draft_tokens)
    for rnd in range(rounds):
        for k in sorted(cores) if rnd % 2 == 0 else sorted(cores, reverse=True):
            out, wall = drive(cores[k], requests(prompts, new_tokens, f"{tag}{rnd}", sampled), in_flight)
            n = sum(len(t) for t in out.values())
            best[k] = max(best[k], n / wall)
            tokens.setdefault(k, out)
    if tokens[0] != tokens[spec_k]:
        raise SystemExit(f"{tag}: speculative decoding changed the tokens")
    drafted = cores[spec_k].num_draft_tokens - before[0]
    accepted = cores[spec_k].num_accepted_draft_tokens - before[1]
    return {"off": best[0], "on": best[spec_k], "drafted": drafted, "accepted": accepted}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speculative-tokens", type=int, default=4)
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--ngram-max", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, "int8")
    k = args.speculative_tokens
    cores = {
        n: EngineCore(
            model,
            tok,
            SchedulerConfig(256, 64, 1024, speculative_tokens=n, ngram_min=args.ngram_min, ngram_max=args.ngram_max),
            16,
            256 << 20,
            prefix_caching=False,
        )
        for n in (0, k)
    }
    for core in cores.values():
        drive(core, requests([[2] + list(range(1000, 1020))], 4, "warm", False), 1)
    new_tokens = 24 if args.quick else 64
    rounds = 2 if args.quick else 3
    vocab = model.config.vocab_size
    random_prompt = [[2] + [1000 + (j * 7919) % (min(vocab, 200000) - 1000) for j in range(127)]]
    dialogues = dialogue_prompts(tok, 4 if args.quick else 8, 1024)
    cases = {
        "random": (random_prompt, False, 1),
        "dialogue": (dialogues, True, 1),
        "dialogue4": (dialogues, True, 4),
    }
    result: dict = {
        "model": args.model,
        "speculative_tokens": k,
        "ngram_min": args.ngram_min,
        "ngram_max": args.ngram_max,
        "new_tokens": new_tokens,
        "threads": args.threads,
    }
    print(
        f"model={args.model} speculative_tokens={k} ngram={args.ngram_min}..{args.ngram_max} "
        f"new_tokens={new_tokens} threads={args.threads}"
    )
    print(f"{'case':>10} {'off tok/s':>10} {'on tok/s':>10} {'speedup':>8} {'drafted':>8} {'accepted':>9} {'rate':>6}")
    for name, (prompts, sampled, in_flight) in cases.items():
        m = measure(cores, prompts, new_tokens, name, sampled, in_flight, rounds)
        rate = m["accepted"] / m["drafted"] if m["drafted"] else 0.0
        print(
            f"{name:>10} {m['off']:>10.1f} {m['on']:>10.1f} {m['on'] / m['off']:>7.2f}x {m['drafted']:>8} "
            f"{m['accepted']:>9} {rate:>6.2f}",
            flush=True,
        )
        result[f"{name}_tokens_per_s_off"] = round(m["off"], 2)
        result[f"{name}_tokens_per_s_on"] = round(m["on"], 2)
        result[f"{name}_speedup_x"] = round(m["on"] / m["off"], 3)
        result[f"{name}_acceptance_rate"] = round(rate, 3)
        result[f"{name}_num_draft_tokens"] = m["drafted"]
    for core in cores.values():
        assert core.kv_manager.num_free_blocks == core.layout.num_blocks
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
