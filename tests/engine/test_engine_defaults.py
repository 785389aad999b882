"""The engine a default configuration builds is the int8 engine the README describes: every linear
layer W8A8 (int8 weights, per-token int8 activations), the tied output projection too, an int8
embedding table, and an int8 KV cache with float32 scales. (Only the KV size is shrunk here.)"""

from __future__ import annotations

import dataclasses

import torch

from salon.engine.api.bootstrap import build_core
from salon.engine.config import EngineConfig
from salon.engine.model.linear import Int8Linear


def test_default_engine_builds_int8_layers_and_an_int8_kv_cache():
    config = dataclasses.replace(EngineConfig(), kv_cache_bytes=8 << 20, warmup=False)
    assert (config.model, config.precision, config.resolved_kv_dtype()) == ("gemma-3-270m", "int8", "int8")
    core = build_core(config)
    model = core.model
    linears = [getattr(lw, name) for lw in model.layers for name in ("qkv", "o", "gate_up", "down")]
    assert len(linears) == 4 * model.config.num_layers
    for linear in linears + [model.lm_head]:
        assert isinstance(linear, Int8Linear) and linear.quantize_activations
        assert linear.w_q.dtype == torch.int8
    assert model.embed.table.dtype == torch.int8 and model.embed.row_scale is not None
    assert core.layout.kv_dtype == "int8"
    for slot in core.kv_cache.slots:
        assert slot.k_cache.dtype == slot.v_cache.dtype == torch.int8
        assert slot.k_scale.dtype == slot.v_scale.dtype == torch.float32


def test_float32_precision_defaults_to_a_float32_kv_cache():
    assert dataclasses.replace(EngineConfig(), precision="float32").resolved_kv_dtype() == "float32"
    assert (
        dataclasses.replace(EngineConfig(), precision="float32", kv_dtype="bfloat16").resolved_kv_dtype() == "bfloat16"
    )
