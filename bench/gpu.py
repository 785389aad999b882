"""GPU model bench: salon's int8 engine step path against transformers' Gemma 3 (static cache, compiled).

On a CUDA device, a synthetic model of the real shapes (salon/engine/model/synthetic_gemma.py; no file travels):
  * salon: a decode step's host time and GPU time (CUDA events), kernel launches per step (torch.profiler),
    decode tokens/s at batch 1 / 8 / 64 / 256 after 512-token prompts over 128 new tokens, prefill tokens/s of
    2,048 and 8,192 tokens; all through the engine's step path (bench.model.EngineSteps: ModelRunner over the
    paged int8 KV cache, the Triton family);
  * the peer: transformers' Gemma3ForCausalLM built from the same config with random bf16 weights, a static
    KV cache and torch.compile(mode="reduce-overhead") (the gpt-fast recipe), greedy generate at the same
    batches and prompt lengths; salon and the peer alternate in rounds (A B, B A, ...: salon.loadgen.alternation)
    and each batch's figure is the median of the rounds' salon/peer ratios with their range;
  * the floor: the bytes a decode step reads (the int8 weights, the KV of every sequence within each layer's
    window) over the device-to-device copy bandwidth measured in the same run;
  * the activation recipes: salon's decode tokens/s at batch 1 and 64 (8 with --quick) with its shipped two int8
    terms a token and with group32's one int8 term a token and 32 channels (the same weights; `recipe_decode`),
    and the Triton family's two-term Linear against the group32 one at the model's layer shapes and M = 1, 8, 64,
    256 (bench/linear_recipes.py; `linear_recipes`); both alternated in rounds, each figure's ratio the median of
    the rounds' with its range.
`--rehearse` (a CPU, no GPU) runs the same code at tiny shapes: synthetic-tiny's first two layers over 512 ids
with int8 weights drawn the same way, batch 1 and 2, a few tokens, salon's Triton family in Triton's interpreter,
the peer on the CPU without compile; the GPU-only figures (CUDA events, launches) are null with the reason. A
figure that cannot be measured is null and `errors` says why; the peer is always measured, never a constant.
Ends with one line `RESULT {json}`.

    python -m bench.gpu [--quick] [--model synthetic-gemma-3-270m|synthetic-gemma-3-1b] [--rounds N]
    TRITON_INTERPRET=1 python -m bench.gpu --rehearse
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from bench.model import EngineSteps
from salon.engine.model.builder import build_int8_model
from salon.engine.model.config import ModelConfig, synthetic_config
from salon.engine.model.synthetic_gemma import build_synthetic_gemma, synthetic_gemma_config, synthetic_int8_checkpoint
from salon.kernels.backend import select_ops
from salon.loadgen.alternation import alternated_pairs, paired_ratio


@dataclasses.dataclass(frozen=True)
class Shapes:
    batches: tuple[int, ...]
    prompt_tokens: int
    new_tokens: int
    prefill_tokens: tuple[int, ...]
    rounds: int
    recipe_batches: tuple[int, ...]  # the decode batches the two activation recipes are compared at


GPU_SHAPES = Shapes((1, 8, 64, 256), 512, 128, (2048, 8192), 3, (1, 64))
QUICK_SHAPES = Shapes((1, 8, 64, 256), 512, 64, (2048, 8192), 2, (1, 8))
REHEARSE_SHAPES = Shapes((1, 2), 4, 1, (8,), 2, (1,))


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def token_ids(batch: int, length: int, vocab: int) -> list[list[int]]:
    return (((torch.arange(batch * length) * 7919) % (vocab - 300)) + 300).view(batch, length).tolist()


# ---------------------------------------------------------------- salon


def salon_decode_tps(model, batch: int, shapes: Shapes, device: str) -> float:
    """Tokens/s of `new_tokens` greedy decode steps after a `prompt_tokens` prompt per sequence (one step warms)."""
    run = EngineSteps(model, batch, shapes.prompt_tokens + shapes.new_tokens + 2)
    tokens = run.step(token_ids(batch, shapes.prompt_tokens, model.config.vocab_size))
    tokens = run.step([[t] for t in tokens])
    sync(device)
    start = time.perf_counter()
    for _ in range(shapes.new_tokens):
        tokens = run.step([[t] for t in tokens])
    sync(device)
    return batch * shapes.new_tokens / (time.perf_counter() - start)


def salon_prefill_tps(model, num_tokens: int, device: str) -> float:
    ids = token_ids(1, num_tokens, model.config.vocab_size)
    EngineSteps(model, 1, num_tokens).step(ids)  # warm: the kernels' compilation for these shapes
    run = EngineSteps(model, 1, num_tokens)
    sync(device)
    start = time.perf_counter()
    run.step(ids)
    sync(device)
    return num_tokens / (time.perf_counter() - start)


def salon_step_profile(model, shapes: Shapes, device: str, steps: int = 8) -> dict:
    """A batch-1 decode step's host time, GPU time (CUDA events) and kernel launches (torch.profiler)."""
    run = EngineSteps(model, 1, shapes.prompt_tokens + 2 * steps + 4)
    tokens = run.step(token_ids(1, shapes.prompt_tokens, model.config.vocab_size))
    for _ in range(2):
        tokens = run.step([[t] for t in tokens])
    host, gpu = [], []
    for _ in range(steps):
        sync(device)
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        start = time.perf_counter()
        tokens = run.step([[t] for t in tokens])  # ends on the host's read of the sampled ids
        host.append((time.perf_counter() - start) * 1e3)
        if device == "cuda":
            end.record()
            end.synchronize()
            gpu.append(begin.elapsed_time(end))
    out = {"step_ms_host": statistics.median(host), "step_ms_gpu": statistics.median(gpu) if gpu else None}
    if device != "cuda":
        out["launches_per_step"] = None
        return out
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            tokens = run.step([[t] for t in tokens])
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    out["launches_per_step"] = len(kernels) / steps
    return out


# ---------------------------------------------------------------- the peer


def peer_model(config: ModelConfig, device: str, compile_it: bool):
    """transformers' Gemma3ForCausalLM of `config` (random bf16 weights on a GPU, float32 on a CPU)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    pattern = next(i + 1 for i, s in enumerate(config.layers) if s.attention == "global")
    sliding = next((s for s in config.layers if s.attention == "sliding"), None)
    global_spec = next(s for s in config.layers if s.attention == "global")
    hf = Gemma3TextConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.ffn_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_context_tokens,
        rms_norm_eps=config.rms_norm_eps,
        sliding_window=sliding.sliding_window_tokens if sliding else config.max_context_tokens,
        layer_types=["sliding_attention" if s.attention == "sliding" else "full_attention" for s in config.layers],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": global_spec.rope_base},
            "sliding_attention": {"rope_type": "default", "rope_theta": sliding.rope_base if sliding else 10_000.0},
        },
        query_pre_attn_scalar=int(round(config.attn_scale**-2)),
        sliding_window_pattern=pattern,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(hf).to(device=device, dtype=dtype).eval()
    model.generation_config.cache_implementation = "static"
    if compile_it:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    return model


@torch.inference_mode()
def peer_generate_s(model, batch: int, prompt: int, new: int, vocab: int, device: str) -> float:
    ids = torch.tensor(token_ids(batch, prompt, vocab), device=device)
    sync(device)
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    sync(device)
    return time.perf_counter() - start


def peer_decode_tps(model, batch: int, shapes: Shapes, vocab: int, device: str) -> float:
    """Decode tokens/s: generate's time for new_tokens less its time for one token (the prefill), per token."""
    one = peer_generate_s(model, batch, shapes.prompt_tokens, 1, vocab, device)
    full = peer_generate_s(model, batch, shapes.prompt_tokens, shapes.new_tokens + 1, vocab, device)
    return batch * shapes.new_tokens / max(full - one, 1e-9)


# ---------------------------------------------------------------- the floor


def copy_bandwidth_gbps(device: str, mib: int) -> float:
    """Device-to-device copy bandwidth: bytes read plus bytes written per second, the best of a few copies."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() / best / 1e9


def decode_step_bytes(model, batch: int, context: int) -> int:
    """What a decode step must read: every weight once, and each sequence's KV within each layer's window."""
    weights = sum(t.numel() * t.element_size() for t in model_tensors(model))
    cfg = model.config
    per_token_layer = 2 * cfg.num_kv_heads * (cfg.head_dim + 4)  # int8 K and V rows with their float32 scales
    # every layer reads its KV, a sharing layer its source's again
    kv = sum(min(context, s.sliding_window_tokens or context) * per_token_layer for s in cfg.layers)
    return weights + batch * kv


def model_tensors(model) -> list[torch.Tensor]:
    seen, out = set(), []
    stack = [model]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            out.append(obj)
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("salon."):
            stack.extend(vars(obj).values())
    return out


# ---------------------------------------------------------------- the run


def salon_model(args, device: str, activations: str = "auto"):
    """The int8 model on the Triton family (`activations`: its Linears' recipe, the family's own by default)."""
    ops = select_ops(device, "triton", activations=activations)
    if args.rehearse:
        # synthetic-tiny's first two layers (sliding, global) over 512 ids: seconds a step in the interpreter
        tiny = synthetic_config("synthetic-tiny")
        config = dataclasses.replace(
            tiny, model_id="rehearse-tiny", vocab_size=512, num_layers=2, layers=tiny.layers[:2]
        )
        return build_int8_model(config, synthetic_int8_checkpoint(config, device), ops), config
    return build_synthetic_gemma(args.model, ops, device), synthetic_gemma_config(args.model)


def recipe_decode(args, model, shapes: Shapes, device: str) -> dict:
    """Decode tokens/s of `model` (two int8 terms a token) and of the same weights with group32 activations, in
    alternated rounds (A B, then B A), at shapes.recipe_batches."""
    group32, _ = salon_model(args, device, activations="group32")
    out = {}
    for batch in shapes.recipe_batches:
        salon_decode_tps(group32, batch, dataclasses.replace(shapes, new_tokens=2), device)  # warm: compilation
        models = [("two_terms", model), ("group32", group32)]
        rates: dict[str, list[float]] = {name: [] for name, _ in models}
        for r in range(shapes.rounds):
            for name, m in models if r % 2 == 0 else reversed(models):
                rates[name].append(salon_decode_tps(m, batch, shapes, device))
        ratios = [g / t for g, t in zip(rates["group32"], rates["two_terms"])]
        out[str(batch)] = {
            "two_terms_tps": statistics.median(rates["two_terms"]),
            "group32_tps": statistics.median(rates["group32"]),
            "group32_over_two_terms_median_x": statistics.median(ratios),
            "group32_over_two_terms_range_x": [min(ratios), max(ratios)],
        }
        print(f"decode batch {batch}, two int8 terms against group32: {out[str(batch)]}")
    return out


def run(args) -> dict:
    device = "cpu" if args.rehearse else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --rehearse on a CPU")
    shapes = REHEARSE_SHAPES if args.rehearse else QUICK_SHAPES if args.quick else GPU_SHAPES
    if args.rounds:
        shapes = dataclasses.replace(shapes, rounds=args.rounds)
    errors: dict[str, str] = {}
    model, config = salon_model(args, device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    print(f"device {name}; model {config.model_id}; shapes {shapes}")
    copy_gbps = copy_bandwidth_gbps(device, 64 if args.rehearse else 2048)
    profile = salon_step_profile(model, shapes, device, steps=1 if args.rehearse else 16)
    if device != "cuda":
        errors["launches_per_step"] = errors["step_ms_gpu"] = "no CUDA device (a rehearsal)"
    print(f"salon decode step (batch 1): {profile}; copy bandwidth {copy_gbps:.0f} GB/s")

    peer = None
    try:
        peer = peer_model(config, device, compile_it=device == "cuda")
    except Exception as e:  # no transformers, or a version without Gemma 3: the peer's figures are null
        errors["peer"] = f"{type(e).__name__}: {e}"
    decode = {}
    for batch in shapes.batches:
        if peer is not None:  # warm the compiled graphs of this batch before the clock
            try:
                peer_decode_tps(peer, batch, dataclasses.replace(shapes, new_tokens=2), config.vocab_size, device)
            except Exception as e:
                errors[f"peer_b{batch}"] = f"{type(e).__name__}: {e}"
        with_peer = peer is not None and f"peer_b{batch}" not in errors
        pairs = alternated_pairs(  # A B, B A, ...: a ratio per round
            lambda batch=batch: salon_decode_tps(model, batch, shapes, device),
            (lambda batch=batch: peer_decode_tps(peer, batch, shapes, config.vocab_size, device))
            if with_peer
            else (lambda: None),
            shapes.rounds,
        )
        salon_rates = [a for a, _ in pairs]
        peer_rates = [b for _, b in pairs if b is not None]
        ratio = paired_ratio(pairs, digits=6)
        floor_ms = decode_step_bytes(model, batch, shapes.prompt_tokens + shapes.new_tokens) / copy_gbps / 1e6
        decode[str(batch)] = {
            "salon_tps": statistics.median(salon_rates),
            "peer_tps": statistics.median(peer_rates) if peer_rates else None,
            "salon_over_peer_median_x": ratio and ratio["median"],
            "salon_over_peer_range_x": ratio and [ratio["min"], ratio["max"]],
            "floor_step_ms": floor_ms,
            "salon_step_ms": batch / statistics.median(salon_rates) * 1e3,
        }
        print(f"decode batch {batch}: {decode[str(batch)]}")
    prefill = {}
    for tokens in shapes.prefill_tokens:
        entry = {"salon_tps": salon_prefill_tps(model, tokens, device), "peer_tps": None}
        if peer is not None:
            try:
                peer_generate_s(peer, 1, tokens, 1, config.vocab_size, device)  # warm this length
                entry["peer_tps"] = tokens / peer_generate_s(peer, 1, tokens, 1, config.vocab_size, device)
            except Exception as e:
                errors[f"peer_prefill_{tokens}"] = f"{type(e).__name__}: {e}"
        prefill[str(tokens)] = entry
        print(f"prefill {tokens}: {entry}")
    from bench import linear_recipes  # here: it imports bench.grouped_gemm, which imports this module

    recipes = linear = rescored = None
    try:
        recipes = recipe_decode(args, model, shapes, device)
    except Exception as e:  # the other figures stand; errors says why these are missing
        errors["recipe_decode"] = f"{type(e).__name__}: {e}"
    try:
        linear = linear_recipes.run(device, shapes.rounds)
    except Exception as e:  # the other figures stand; errors says why these are missing
        errors["linear_recipes"] = f"{type(e).__name__}: {e}"
    try:
        rescored = linear_recipes.run_rescored(device, shapes.rounds)
    except Exception as e:  # the other figures stand; errors says why these are missing
        errors["rescored"] = f"{type(e).__name__}: {e}"
    return {
        "device": name,
        "model": config.model_id,
        "rehearse": bool(args.rehearse),
        "step_ms_host": profile["step_ms_host"],
        "step_ms_gpu": profile["step_ms_gpu"],
        "launches_per_step": profile["launches_per_step"],
        "copy_gbps": copy_gbps,
        "floor_step_ms_b1": decode[str(shapes.batches[0])]["floor_step_ms"],
        "decode": decode,
        "prefill": prefill,
        "recipe_decode": recipes,
        "linear_recipes": linear,
        "rescored": rescored,
        "peer": "transformers Gemma3ForCausalLM, static cache"
        + (", torch.compile reduce-overhead" * (device == "cuda"))
        if peer is not None
        else None,
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 new tokens and 2 rounds per batch")
    parser.add_argument("--rehearse", action="store_true", help="a CPU: tiny shapes, Triton's interpreter")
    parser.add_argument("--model", default="synthetic-gemma-3-270m", help="synthetic-gemma-3-270m | -1b")
    parser.add_argument("--rounds", type=int, default=0, help="salon/peer rounds per batch (default by mode)")
    args = parser.parse_args(argv)
    print("RESULT " + json.dumps(run(args), default=float))


if __name__ == "__main__":
    main()
