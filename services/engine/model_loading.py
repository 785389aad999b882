"""Getting (CausalLM, Tokenizer) for a model name.

services.engine.model's load_model is the source of truth. Until it is importable, synthetic
configs are built here from the model package's own pieces (seeded random float weights, the real
Gemma vocabulary), so the engine process can run end to end.
"""

from __future__ import annotations

import importlib

import torch

from kernels.backend import select_ops


def load_model(name: str, precision: str = "int8", device: str = "cpu"):
    for module in ("services.engine.model", "services.engine.model.loader", "services.engine.model.load"):
        try:
            fn = getattr(importlib.import_module(module), "load_model", None)
        except ModuleNotFoundError:
            continue
        if fn is not None:
            return fn(name, precision=precision)
    if name.startswith("synthetic-"):
        return _synthetic(name, device)
    raise RuntimeError(f"services.engine.model provides no load_model (needed for {name!r})")


def _synthetic(name: str, device: str):
    from services.engine.model.builder import build_float_model
    from services.engine.model.config import synthetic_config
    from services.engine.model.gguf_file import default_gguf_path, open_gguf, read_vocab
    from services.engine.model.tokenizer import Tokenizer

    cfg = synthetic_config(name)
    gen = torch.Generator().manual_seed(cfg.random_weights_seed or 0)
    d, hq, hkv, hd, ffn = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.ffn_dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.2

    w = {"embed": rand(cfg.vocab_size, d), "final_norm": torch.ones(d)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        w.update({p + "attn_q": rand(hq * hd, d), p + "attn_k": rand(hkv * hd, d), p + "attn_v": rand(hkv * hd, d),
                  p + "attn_output": rand(d, hq * hd), p + "ffn_gate": rand(ffn, d), p + "ffn_up": rand(ffn, d),
                  p + "ffn_down": rand(d, ffn), p + "attn_q_norm": torch.ones(hd), p + "attn_k_norm": torch.ones(hd)})
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            w[p + n] = torch.ones(d)
    model = build_float_model(cfg, w, select_ops(device))
    tokenizer = Tokenizer(read_vocab(open_gguf(default_gguf_path())))
    return model, tokenizer
