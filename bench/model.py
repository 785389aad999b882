"""Model benchmark: load time, weight bytes, KV bytes/token, prefill and decode tokens/s, perplexity.

Prefill and decode of the int8 model run on the engine's paged int8 KV cache and kernels (PagedKV
below: fixed block tables, no scheduler); the float32 baseline of the same code, measured in the same
run, uses DenseAttention (contiguous float KV). Each decode step runs forward for B new tokens (one per
sequence), the logits of those B rows and an argmax -- the model's cost per generated token, without
the scheduler, sampler and block manager of the engine.

    python -m bench.model [--model NAME|PATH] [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from services.engine.attention_backend import ForwardBatch, PagedAttention
from services.engine.kv_cache import KVCache
from services.engine.kv_layout import plan_layout
from services.engine.model import DenseAttention, load_model
from services.engine.model.config import synthetic_config
from services.engine.model.perplexity import perplexity

REF_PPL = 13.829072782896715


class PagedKV:
    """DenseAttention's interface over the engine's paged int8 cache: sequence s, group g owns the fixed
    blocks [(s * groups + g) * per_seq, ...) (sliding-window groups keep theirs: no release here)."""

    BLOCK = 16

    def __init__(self, model, num_seqs: int = 1, max_tokens: int = 4096) -> None:
        cfg = model.config
        per_seq = -(-max_tokens // self.BLOCK)
        probe = plan_layout(cfg, self.BLOCK, 1 << 30)
        groups = len(probe.groups)
        layout = plan_layout(cfg, self.BLOCK, probe.page_bytes * num_seqs * groups * per_seq)
        self.attention = PagedAttention(KVCache(layout), model.kernel_ops.kv_write, model.kernel_ops.paged_attention,
                                        cfg.attn_scale)
        first = torch.arange(num_seqs)[:, None] * groups * per_seq + torch.arange(per_seq)[None, :]
        self.tables = [(first + g * per_seq).to(torch.int32) for g in range(groups)]
        self.lens = [0] * num_seqs

    def begin_step(self, query_lens: list[int]) -> torch.Tensor:
        positions = torch.cat([torch.arange(n0, n0 + q) for n0, q in zip(self.lens, query_lens)])
        seq_of_row = torch.repeat_interleave(torch.arange(len(query_lens)), torch.tensor(query_lens))
        self.lens = [n0 + q for n0, q in zip(self.lens, query_lens)]
        slots = [t[seq_of_row, positions // self.BLOCK].long() * self.BLOCK + positions % self.BLOCK
                 for t in self.tables]
        self.attention.batch = ForwardBatch(
            token_ids=torch.empty(0, dtype=torch.int64), positions=positions,
            query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32),
            seq_lens=torch.tensor(self.lens, dtype=torch.int32), block_tables=self.tables, slot_mappings=slots,
            sample_rows=torch.empty(0, dtype=torch.int64))
        return positions

    def __call__(self, layer_idx, q, k, v):
        return self.attention(layer_idx, q, k, v)


def _backend(model, num_seqs: int = 1, max_tokens: int = 4096):
    if model.precision == "int8":
        return PagedKV(model, num_seqs, max_tokens)
    return DenseAttention(model.config, num_seqs=num_seqs)


def _prefill_tps(model, num_tokens: int, repeats: int) -> float:
    ids = torch.arange(1000, 1000 + num_tokens) % (model.config.vocab_size - 300) + 300
    best = float("inf")
    for _ in range(repeats):
        attn = _backend(model, 1, num_tokens)
        start = time.perf_counter()
        hidden = model.forward(ids, attn.begin_step([num_tokens]), attn)
        model.logits(hidden[-1:])
        best = min(best, time.perf_counter() - start)
    return num_tokens / best


def _decode_tps(model, batch: int, steps: int, prompt_tokens: int = 32) -> float:
    attn = _backend(model, batch, prompt_tokens + steps)
    ids = (torch.arange(batch * prompt_tokens) * 7919) % (model.config.vocab_size - 300) + 300
    hidden = model.forward(ids, attn.begin_step([prompt_tokens] * batch), attn)
    last = hidden.view(batch, prompt_tokens, -1)[:, -1]
    tokens = model.logits(last).argmax(-1)
    start = time.perf_counter()
    for _ in range(steps):
        hidden = model.forward(tokens, attn.begin_step([1] * batch), attn)
        tokens = model.logits(hidden).argmax(-1)
    return batch * steps / (time.perf_counter() - start)


def _kv_table(g) -> dict[str, float]:
    baseline = 2 * g.num_layers * 8 * g.head_dim * 2  # GQA-8, bf16, every layer global, no sharing
    int8 = g.kv_bytes_per_token()
    ctx = 32768
    live = sum(2 * g.num_kv_heads * (g.head_dim + 4) * (min(ctx, s.sliding_window_tokens or ctx) / ctx)
               for s in g.layers)
    tiny, tiny_noshare = synthetic_config("synthetic-tiny"), synthetic_config("synthetic-tiny-noshare")
    tiny_base = 2 * tiny.num_layers * 8 * tiny.head_dim * 2
    return {
        "kv_bytes_per_token": int8,
        "kv_bytes_per_token_baseline_gqa8_bf16_global": baseline,
        "kv_reduction_x": round(baseline / int8, 2),
        "kv_bytes_per_token_live_at_32k": round(live, 1),
        "kv_reduction_live_at_32k_x": round(baseline / live, 1),
        "kv_bytes_per_token_synthetic_tiny": tiny.kv_bytes_per_token(),
        "kv_bytes_per_token_synthetic_tiny_noshare": tiny_noshare.kv_bytes_per_token(),
        "kv_bytes_per_token_synthetic_tiny_baseline": tiny_base,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gemma-3-270m", help="a known model name or a path to a .gguf")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reference-dir", default="../shared/reference", help="holds gpl-3.txt")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict[str, float] = {}
    models = {}
    for precision in ("int8", "float32"):
        start = time.perf_counter()
        model, tok = load_model(args.model, precision=precision)
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
        for batch in (1, 8, 32):
            result[f"decode_tokens_per_s_b{batch}{sfx}"] = round(_decode_tps(model, batch, steps), 1)
        print(json.dumps({k: v for k, v in result.items() if k.endswith(sfx) or sfx == ""}), flush=True)
    with open(f"{args.reference_dir}/gpl-3.txt") as f:
        text = f.read()
    ids = tok.encode(text, parse_special=False)
    bos = tok.bos_token_id if tok.add_bos else None  # llama-perplexity replaces each chunk's first token by BOS
    ref_ppl = REF_PPL if args.model == "gemma-3-270m" else None  # the float64 reference exists for Gemma only
    chunks = 2 if args.quick else None
    result["ppl_chunks"] = chunks or len(ids) // 512
    result["ppl_fp32"] = round(perplexity(models["float32"], ids, bos, max_chunks=chunks).ppl, 4)
    result["ppl_int8"] = round(perplexity(models["int8"], ids, bos, max_chunks=chunks, kv_int8=True).ppl, 4)
    if not args.quick:
        result["ppl_int8_no_kv"] = round(perplexity(models["int8"], ids, bos).ppl, 4)
        result["ppl_fp32_int8_kv"] = round(perplexity(models["float32"], ids, bos, kv_int8=True).ppl, 4)
        wq = models["int8"]
        for lw in wq.layers:
            for name in ("qkv", "o", "gate_up", "down"):
                getattr(lw, name).quantize_activations = False
        wq.lm_head.quantize_activations = False
        result["ppl_int8_weights_only"] = round(perplexity(wq, ids, bos).ppl, 4)
        result["ppl_reference_f64"] = ref_ppl
    for k in ("ppl_fp32", "ppl_int8"):
        if not args.quick and ref_ppl is not None:
            result[k + "_vs_ref_pct"] = round(100 * (result[k] / ref_ppl - 1), 3)
    print(f"{'metric':48s} value")
    for k, v in result.items():
        print(f"{k:48s} {v}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
