"""Where a step's time goes: the int8 model's decode steps and a prompt's prefill through the engine's own
step path (bench.model's EngineSteps: ModelRunner over the paged KV cache, the CPU kernels, greedy sampling),
broken down by part.

A decode step runs its decoder layers as one fused call where the kernel family has it (salon.kernels.decoder_block's
decoder_blocks: every Gemma 3 or Llama layer of the step in one C call). The bench times the step as served (fused)
and, in the same run, the same step with one fused call per layer (decoder_block: the Python between the layers'
calls is what the one call saves) and with every layer composed of its ops (the fused op's baseline), and splits the
first and last by part: each kernel
op of the model's op family (salon.kernels.backend.Ops) is wrapped in a timer, so a step's wall time splits into

  * decoder_block: the fused layers (everything of a layer: its GEMMs, attention, norms, RoPE, KV writes);
  * linear_layers, linear_lm_head: the fused Linears that run as one C call (salon.kernels.linear_two_terms: the
    RMSNorm before, both int8 activation terms, the one int16 term or group32's one int8 term per 32 channels, the
    GEMM, the post-norm and residual; up to its MAX_ROWS rows, grouped weights) of the composed decoder layers and
    of the output projection, and the rescored output projection (salon.kernels.linear_rescored);
  * gemm_layers: the decoder layers' GEMMs (qkv, o, gate_up, down) where they run as their own C calls;
  * gemm_lm_head: the output projection (262,144 x 640 on Gemma 3 270M) where it runs as its own C call;
  * quantize: the activations' quantization (two int8 terms, one int16 term, or one int8 term with the
    RMSNorm fused);
  * rmsnorm: the RMSNorms not fused into a quantization;
  * attention, rope, kv_write, glu: the paged attention, RoPE (with the q/k norms before it, where one call
    runs both: salon.kernels.rmsnorm_rope), KV-write and gated-activation (GeGLU, SwiGLU) kernels;
  * other: the rest of the step -- the model's PyTorch glue (residual adds, views), the embedding, the
    ForwardBatch, sampling, the Python in between.

Baselines in the same run: the same steps without the timers (the timers' own cost is the difference), the composed
step, and the GEMM floor -- the weight and scale bytes a step reads over a streaming read (torch sum over 512 MB,
the same threads; measured before the steps and again after them), the time the GEMMs would take at the memory's
practical limit; over the batch-1 step (where --batches starts with 1), the least a larger batch's step over batch
1's can be while its weights come from memory -- and the product floor: the step's exact products over the product
ceiling of their recipe (bench/int8_ceiling.c via bench.gemv, the same threads: the int8 one for two-term Linears,
the int16 one for int16-activation Linears), the time they would take at the instructions' limit (on AVX2 the decode
of 4 or more sequences is bound by its products before memory). Where every Linear runs the group32 recipe (Gemma
3's default), also the resident floor: the step's products at the rate the group32 GEMM reaches on weights that stay
in L2 at the batch's rows (bench.group32_gemm's resident_gmacs, measured after the batch's rounds), what its
instructions allow without any memory traffic. The prefill of a --prefill-token prompt (512; 0 skips it: more rows
than the fused op takes, so it is composed) is split the same way, best of the rounds.

    python -m bench.step_profile [--quick] [--model NAME] [--batches 1,4,8] [--prefill 512] [--threads N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import defaultdict

import torch

from bench.gemv import int8_product_ceiling_gmacs, int16_activation_ceiling_gmacs
from bench.group32_gemm import resident_gmacs
from bench.model import EngineSteps
from salon.engine.model import load_model
from salon.engine.model.builder import FUSED
from salon.kernels.backend import select_ops
from salon.kernels.cpu.linear_two_terms import linear_two_terms_c
from salon.kernels.cpu.quantize import quantize_int16_cpu
from salon.kernels.cpu.w8a8_grouped import packed_weights
from salon.kernels.cpu.w16a8_grouped import w16a8_gemm_cpu
from salon.kernels.decoder_block import no_decoder_block, no_decoder_blocks
from salon.kernels.linear_two_terms import compose

STREAM_BYTES = 512 * 2**20
PARTS = (
    "decoder_block",
    "linear_layers",
    "linear_lm_head",
    "gemm_layers",
    "gemm_lm_head",
    "quantize",
    "rmsnorm",
    "attention",
    "rope",
    "kv_write",
    "glu",
)
# The parts that read the weights (the GEMM bandwidth is computed over them; decoder_block also holds the layers'
# attention and row-wise ops).
WEIGHT_PARTS = ("decoder_block", "linear_layers", "linear_lm_head", "gemm_layers", "gemm_lm_head")
# The step as served (the step's layers in one fused call where the family has it), one fused call per layer, and
# every layer composed of its ops; the middle one is timed without the timers only.
VARIANTS = ("fused", "per_layer", "composed")
TIMED_VARIANTS = ("fused", "composed")


class Timers:
    """Seconds spent per part while `on`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.on = False

    def wrap(self, part_of, fn):
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds[part_of(*args)] += time.perf_counter() - start
            return out

        return timed


def variant_ops(variant: str):
    """The CPU op family of a variant: as served ("fused"), with one fused call per layer ("per_layer"), or without
    the fused layer ("composed")."""
    base = select_ops("cpu")
    if variant == "fused":
        return base
    if variant == "per_layer":
        return dataclasses.replace(base, decoder_blocks=no_decoder_blocks)
    return dataclasses.replace(base, decoder_block=no_decoder_block, decoder_blocks=no_decoder_blocks)


def instrumented_ops(timers: Timers, vocab_size: int, variant: str = "fused"):
    """The CPU op family of `variant` with every op timed (the GEMM split by whether its weight is the output
    projection)."""
    base = variant_ops(variant)
    fixed = {
        "quantize_per_token": "quantize",
        "quantize_two_terms": "quantize",
        "rmsnorm_quant": "quantize",
        "rmsnorm": "rmsnorm",
        "paged_attention": "attention",
        "rope_neox": "rope",
        "rmsnorm_rope": "rope",
        "kv_write": "kv_write",
        "geglu": "glu",
        "swiglu": "glu",
        "decoder_block": "decoder_block",
        "decoder_blocks": "decoder_block",
    }
    wrapped = {op: timers.wrap(lambda *a, part=part: part, getattr(base, op)) for op, part in fixed.items()}
    wrapped["w8a8_gemm"] = timers.wrap(
        lambda a_q, a_scale, w_q, *rest: "gemm_lm_head" if w_q.shape[0] == vocab_size else "gemm_layers", base.w8a8_gemm
    )
    fused = timers.wrap(
        lambda x, w_q, *rest: "linear_lm_head" if w_q.shape[0] == vocab_size else "linear_layers", linear_two_terms_c
    )
    composed = compose(wrapped["rmsnorm"], wrapped["quantize_two_terms"], wrapped["w8a8_gemm"])

    def linear_two_terms(*args):  # the one C call where it runs, else the timed parts one by one
        out = fused(*args)
        return composed(*args) if out is None else out

    wrapped["linear_two_terms"] = linear_two_terms
    fused16 = timers.wrap(
        lambda x, w_q, *rest: "linear_lm_head" if w_q.shape[0] == vocab_size else "linear_layers",
        lambda *a: linear_two_terms_c(*a, recipe="int16"),
    )
    gemm16 = timers.wrap(
        lambda a, a_scale, w_q, *rest: "gemm_lm_head" if w_q.shape[0] == vocab_size else "gemm_layers", w16a8_gemm_cpu
    )
    composed16 = compose(wrapped["rmsnorm"], timers.wrap(lambda *a: "quantize", quantize_int16_cpu), gemm16, terms=1)

    def linear_int16(*args):
        out = fused16(*args)
        return composed16(*args) if out is None else out

    wrapped["linear_int16"] = linear_int16
    wrapped["linear_group32"] = timers.wrap(
        lambda x, w_q, *rest: "linear_lm_head" if w_q.shape[0] == vocab_size else "linear_layers", base.linear_group32
    )
    wrapped["linear_rescored"] = timers.wrap(lambda *a: "linear_lm_head", base.linear_rescored)
    return dataclasses.replace(base, **wrapped)


def _steps(run: EngineSteps, tokens: list[int], n: int) -> tuple[list[int], float]:
    start = time.perf_counter()
    for _ in range(n):
        tokens = run.step([[t] for t in tokens])
    return tokens, (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=256, help="prompt tokens per sequence before the steps")
    parser.add_argument("--prefill", type=int, default=512, help="prompt tokens of the prefill profile (0: none)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steps = 10 if args.quick else 40
    rounds = 2 if args.quick else 4

    timers = Timers()
    models = {}  # (variant, timed) -> model
    for variant in VARIANTS:
        models[(variant, False)], _ = load_model(args.model, "int8", kernel_ops=variant_ops(variant), progress=False)
        if variant in TIMED_VARIANTS:
            models[(variant, True)], _ = load_model(
                args.model, "int8", progress=False, kernel_ops=instrumented_ops(timers, vocab_size(models), variant)
            )
    plain = models[("fused", False)]
    vocab = plain.config.vocab_size

    x = torch.ones(STREAM_BYTES // 4)
    x.sum()
    stream_gbps = _stream_gbps(x)
    result: dict = {"threads": args.threads, "context_tokens": args.context, "stream_read_gbps": round(stream_gbps, 2)}
    print(
        f"threads {args.threads}; streaming read {stream_gbps:.1f} GB/s; {args.context}-token contexts, "
        f"{steps} steps x {rounds} rounds, best round"
    )
    weight_read = _step_read_bytes(plain)
    floor_ms = weight_read / stream_gbps / 1e6
    result["step_read_bytes"] = weight_read
    result["gemm_floor_ms"] = round(floor_ms, 3)
    print(f"a step reads {weight_read / 1e6:.1f} MB of weights and scales: GEMM floor {floor_ms:.2f} ms")
    ceiling8 = int8_product_ceiling_gmacs(args.threads, 5)
    ceiling16 = int16_activation_ceiling_gmacs(args.threads, 5)
    products8, products16 = _step_products_per_row(plain)
    result["int8_product_ceiling_gmacs"] = None if ceiling8 is None else round(ceiling8, 2)
    result["int16_activation_ceiling_gmacs"] = None if ceiling16 is None else round(ceiling16, 2)
    # ns per sequence of a step's products at their ceilings (None where a needed ceiling is missing)
    product_ns = (
        None
        if (products8 and ceiling8 is None) or (products16 and ceiling16 is None)
        else products8 / (ceiling8 or 1) + products16 / (ceiling16 or 1)
    )
    if product_ns is not None:
        print(
            f"product ceilings (bench/int8_ceiling.c): int8 {ceiling8 or 0:.1f}, int16 activations "
            f"{ceiling16 or 0:.1f} GMAC/s (two-term units); a step makes {(products8 + products16) / 1e6:.0f} M "
            f"such products per sequence ({products16 / 1e6:.0f} M of them as int16 terms)"
        )
    # the step's Linears all group32 (the output projection rescored): the group32 GEMM's resident rate applies
    group32 = all(lin.group32_activations or lin.rescored for lin in _step_linears(plain))
    b1_step = None  # the batch-1 step, where --batches starts with 1
    for batch in (int(b) for b in args.batches.split(",")):
        prompts = ((torch.arange(batch * args.context) * 7919) % (vocab - 300) + 300).view(batch, args.context).tolist()
        runs = {}
        for key_, model in models.items():
            run = EngineSteps(model, batch, args.context + rounds * steps + 8)
            runs[key_] = (run, run.step(prompts))
        best = {key_: float("inf") for key_ in models}
        best_parts: dict[str, dict[str, float]] = {variant: {} for variant in TIMED_VARIANTS}
        for _ in range(rounds):  # alternate, best round of each
            for key_ in models:
                variant, timed = key_
                run, tokens = runs[key_]
                timers.seconds.clear()
                timers.on = timed
                tokens, t = _steps(run, tokens, steps)
                timers.on = False
                runs[key_] = (run, tokens)
                if t < best[key_]:
                    best[key_] = t
                    if timed:
                        best_parts[variant] = {p: timers.seconds.get(p, 0.0) / steps for p in PARTS}
        key = f"b{batch}"
        fused, per_layer, composed = (best[(v, False)] for v in VARIANTS)
        result[f"{key}_step_ms"] = round(fused * 1e3, 3)
        result[f"{key}_step_per_layer_ms"] = round(per_layer * 1e3, 3)
        result[f"{key}_per_layer_over_fused_x"] = round(per_layer / fused, 3)
        result[f"{key}_step_composed_ms"] = round(composed * 1e3, 3)
        result[f"{key}_composed_over_fused_x"] = round(composed / fused, 3)
        print(
            f"batch {batch}: step {fused * 1e3:.2f} ms ({batch / fused:.1f} tok/s); one fused call per layer "
            f"{per_layer * 1e3:.2f} ms ({per_layer / fused:.3f}x); each layer composed of its ops "
            f"{composed * 1e3:.2f} ms ({composed / fused:.2f}x); the GEMM floor is "
            f"{100 * floor_ms / 1e3 / fused:.0f}% of the step"
        )
        if batch == 1:
            b1_step = fused
        elif b1_step is not None:  # what the batch-8 / batch-1 target meets where batch 1 reads faster than memory
            result[f"{key}_over_b1_x"] = round(fused / b1_step, 3)
            result[f"{key}_floor_over_b1_x"] = round(floor_ms / 1e3 / b1_step, 3)
            print(
                f"  {fused / b1_step:.3f}x the batch-1 step; while its weights come at the streaming read it cannot "
                f"be under the GEMM floor, {floor_ms / 1e3 / b1_step:.3f}x the batch-1 step (which beats it where the "
                f"weights stay in the last-level cache from step to step)"
            )
        if product_ns is not None:
            products_ms = batch * product_ns / 1e6
            result[f"{key}_product_floor_ms"] = round(products_ms, 3)
            print(
                f"  its products at the product ceilings: {products_ms:.2f} ms (the step is bound by "
                f"{'its products' if products_ms > floor_ms else 'memory'} at best)"
            )
        resident = resident_gmacs(batch, torch.Generator().manual_seed(batch)) if group32 else None
        if resident is not None:  # right after the batch's rounds
            resident_ms = batch * (products8 + products16) / resident / 1e6
            result[f"{key}_resident_gemm_gmacs"] = round(resident, 1)
            result[f"{key}_resident_floor_ms"] = round(resident_ms, 3)
            print(
                f"  its products at the group32 GEMM's rate on L2-resident weights ({resident:.1f} GMAC/s at "
                f"{batch} rows, bench.group32_gemm): {resident_ms:.2f} ms, the instructions' floor without memory"
            )
        for variant in TIMED_VARIANTS:
            timed = best[(variant, True)]
            parts = {p: v for p, v in best_parts[variant].items() if v > 0}
            other = timed - sum(parts.values())
            prefix = key if variant == "fused" else f"{key}_composed"
            result[f"{prefix}_step_timed_ms"] = round(timed * 1e3, 3)
            print(f"  {variant}, with the timers {timed * 1e3:.2f} ms:")
            for part, seconds in (*parts.items(), ("other", other)):
                result[f"{prefix}_{part}_ms"] = round(seconds * 1e3, 3)
                print(f"    {part:13s} {seconds * 1e3:7.3f} ms  {100 * seconds / timed:5.1f}%")
            gemm = sum(parts.get(p, 0.0) for p in WEIGHT_PARTS)
            result[f"{prefix}_gemm_gbps"] = round(weight_read / gemm / 1e9, 2)
            result[f"{prefix}_gemm_pct_of_stream"] = round(100 * weight_read / gemm / 1e9 / stream_gbps, 1)
            print(
                f"    the weight-reading parts read {weight_read / gemm / 1e9:.1f} GB/s "
                f"({100 * weight_read / gemm / 1e9 / stream_gbps:.0f}% of the streaming read)"
            )
    again = _stream_gbps(x)
    result["stream_read_after_gbps"] = round(again, 2)
    print(
        f"streaming read again after the steps: {again:.1f} GB/s (the percentages use the first; a gap between "
        f"the two says the machine's load changed)"
    )
    if args.prefill:
        _prefill_profile(plain, models[("composed", True)], timers, args.prefill, rounds, result)
    print("RESULT " + json.dumps(result))


def vocab_size(models: dict) -> int:
    return next(iter(models.values())).config.vocab_size


def _stream_gbps(x: torch.Tensor) -> float:
    """A streaming read's GB/s: torch sum over x, best of 5."""
    return x.numel() * x.element_size() / min(_time(lambda: x.sum()) for _ in range(5)) / 1e9


def _prefill_profile(plain, timed_model, timers: Timers, num_tokens: int, rounds: int, result: dict) -> None:
    vocab = plain.config.vocab_size
    ids = ((torch.arange(num_tokens) * 7919) % (vocab - 300) + 300).tolist()
    best_plain = best_timed = float("inf")
    best_parts: dict[str, float] = {}
    for _ in range(rounds):
        start = time.perf_counter()
        EngineSteps(plain, 1, num_tokens).step([ids])
        best_plain = min(best_plain, time.perf_counter() - start)
        run = EngineSteps(timed_model, 1, num_tokens)
        timers.seconds.clear()
        timers.on = True
        start = time.perf_counter()
        run.step([ids])
        t = time.perf_counter() - start
        timers.on = False
        if t < best_timed:
            best_timed, best_parts = t, {p: timers.seconds.get(p, 0.0) for p in PARTS}
    key = f"prefill{num_tokens}"
    result[f"{key}_ms"] = round(best_plain * 1e3, 3)
    result[f"{key}_timed_ms"] = round(best_timed * 1e3, 3)
    print(
        f"prefill of {num_tokens} tokens: {best_plain * 1e3:.1f} ms ({num_tokens / best_plain:.0f} tok/s); with "
        f"the timers {best_timed * 1e3:.1f} ms"
    )
    for part, seconds in (*best_parts.items(), ("other", best_timed - sum(best_parts.values()))):
        result[f"{key}_{part}_ms"] = round(seconds * 1e3, 3)
        print(f"  {part:13s} {seconds * 1e3:8.2f} ms  {100 * seconds / best_timed:5.1f}%")


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _step_linears(model) -> list:
    """The Linears a decode step runs: each decoder layer's, then the output projection."""
    return [getattr(layer, name) for layer in model.layers for name in FUSED] + [model.lm_head]


def _step_products_per_row(model) -> tuple[int, int]:
    """A decode step's products per sequence, in int8 products of the two-term recipe: (those of int8-term
    Linears: every weight once per term; those of int16-activation Linears: every weight twice, each int16
    product standing for the two it replaces, as bench.gemv's int16 ceiling counts them)."""
    linears = _step_linears(model)
    int16 = sum(2 * lin.w_q.numel() for lin in linears if lin.int16_activations)
    # a rescored projection: one group32 term a row (its few rescored blocks' two-term products left out)
    terms = [1 if lin.rescored else lin.activation_terms for lin in linears]
    return sum(lin.w_q.numel() * t for lin, t in zip(linears, terms) if not lin.int16_activations), int16


def _step_read_bytes(model) -> int:
    """Bytes of int8 weights and their scales a decode step reads: every Linear of the decoder layers and the
    output projection (the embedding's row lookups are not counted); where the VNNI GEMM reads a packed copy
    (salon.kernels.cpu.w8a8_grouped.packed_weights: two-term grouped Linears), that copy's bytes (float16 scales where
    the matrix's scales are float16 values)."""
    total = 0
    for lin in _step_linears(model):
        # packed_weights declines what the VNNI GEMM does not read packed (no VNNI, per-row scales); the int16
        # recipe's GEMM (AVX2's) reads the weights as they lie
        packed = None if lin.int16_activations else packed_weights(lin.w_q, lin.w_scale)
        total += lin.nbytes() if packed is None else packed.numel()
    return total


if __name__ == "__main__":
    main()
