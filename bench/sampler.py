"""Sampling a decode step's rows on the CPU (salon/kernels/cpu/sample.c): the engine's build against its baseline,
the same source with every row through the bins, the mass histogram over every token and the walk over the
vocabulary (bench/sample_full_histogram.c: neither the top-p look among the top bins' tokens nor the plain
temperature path without bins), in alternated rounds, a ratio per round (salon.loadgen.alternation).

The rows are a model's own: --rows sequences (32-token prompts) decoded --steps greedy steps through the engine's
step path (bench.model's EngineSteps), the logits of the last step kept (the model's int8 output projection). For
each top_p of TOP_PS at temperature 0.7 (the dialogue trace's, salon.loadgen.presets), one round times a call
sampling every row, best of REPEATS calls, on each side:

    sample_ms_top_p_<p>             the engine's build, median of the rounds
    sample_ms_top_p_<p>_baseline    the full-histogram build
    sample_top_p_<p>_over_baseline_x  {median, min, max, rounds, ...}: the first over the second, per round
    argmax_ms                       the greedy pick of the same rows (salon/kernels/cpu/argmax.c), for scale

Every token drawn is checked equal across the builds (the same rule). There is no peer figure: llama.cpp's sampler
is not timed on its own here (`peer: null`).

    python -m bench.sampler [--quick] [--model NAME] [--rows 8] [--steps 16] [--threads N]

The last line is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from bench.alternate import shortest_seconds
from bench.model import EngineSteps
from salon.engine.model import load_model
from salon.kernels.cpu.argmax import argmax_rows_cpu
from salon.kernels.cpu.sample import sample_rows_cpu
from salon.loadgen.alternation import alternated_pairs, describe, paired_ratio

TOP_PS = (1.0, 0.95, 0.8)
TEMPERATURE = 0.7
REPEATS = 5
BASELINE = Path(__file__).with_name("sample_full_histogram.c")


def step_logits(model, rows: int, steps: int) -> torch.Tensor:
    """f32[rows, vocab]: the logits of the last of `steps` greedy decode steps of `rows` sequences."""
    run = EngineSteps(model, rows, 32 + steps + 1)
    kept: list[torch.Tensor] = []
    run.runner.logits_observer = lambda owners, logits: kept.append(logits.clone())
    ids = ((torch.arange(rows * 32) * 7919) % (model.config.vocab_size - 300) + 300).view(rows, 32).tolist()
    tokens = run.step(ids)
    for _ in range(steps):
        tokens = run.step([[t] for t in tokens])
    return kept[-1].contiguous()


def best_ms(fn) -> float:
    return shortest_seconds(fn, REPEATS) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rounds = 3 if args.quick else 9
    model, _ = load_model(args.model, progress=False)
    logits = step_logits(model, args.rows, args.steps)
    n = logits.shape[0]
    rows = list(range(n))
    us = [(0.137 + 0.618 * i) % 1.0 for i in range(n)]
    result: dict = {"model": args.model, "rows": n, "threads": args.threads, "temperature": TEMPERATURE, "peer": None}
    print(f"{args.model}: {n} rows of {logits.shape[1]} logits, temperature {TEMPERATURE}, {args.threads} threads")
    for top_p in TOP_PS:

        def draw(source=None, top_p=top_p):
            kw = {} if source is None else {"source": source}
            return sample_rows_cpu(logits, rows, [TEMPERATURE] * n, [0] * n, [top_p] * n, us, **kw)

        shipped, baseline = draw(), draw(BASELINE)
        if shipped is None or baseline is None:
            raise SystemExit("the C sampler does not run here (needs AVX-512 or AVX2 + FMA and a C compiler)")
        if shipped != baseline:
            raise SystemExit(f"top_p {top_p}: the builds drew different tokens: {shipped} != {baseline}")
        ratio = paired_ratio(
            alternated_pairs(lambda: best_ms(draw), lambda: best_ms(lambda: draw(BASELINE)), rounds),
            ("shipped_ms", "baseline_ms"),
        )
        key = f"top_p_{top_p:g}"
        result[f"sample_ms_{key}"] = round(ratio["shipped_ms_median"], 3)
        result[f"sample_ms_{key}_baseline"] = round(ratio["baseline_ms_median"], 3)
        result[f"sample_{key}_over_baseline_x"] = ratio
        print(
            f"top_p {top_p:g}: {ratio['shipped_ms_median']:.3f} ms a step's rows, baseline "
            f"{ratio['baseline_ms_median']:.3f} ms; " + describe("over the baseline", ratio)
        )
    result["argmax_ms"] = round(statistics.median(best_ms(lambda: argmax_rows_cpu(logits)) for _ in range(rounds)), 3)
    print(f"greedy pick of the same rows: {result['argmax_ms']:.3f} ms")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
