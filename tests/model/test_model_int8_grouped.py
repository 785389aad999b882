"""Group-scaled int8 weights on the model side: the grid quantize_weight(w, 32) rounds to is the one the
quantization ceilings measured (bench/quant_ceilings.fake_quantize), Int8Linear and the token table serve it
with the grouped W8A8 contract (salon/kernels/w8a8_grouped.py), and a checkpoint built with weight_group=32 holds
one scale per row and 32 channels in every matrix."""

from __future__ import annotations

import pytest
import torch

from bench.quant_ceilings import fake_quantize
from salon.engine.model import synthetic_config
from salon.engine.model.builder import FUSED, build_int8_model
from salon.engine.model.checkpoint import calibrate_float, calibration_sequences
from salon.engine.model.layers import Embedding
from salon.engine.model.linear import Int8Linear, dequantize_weight, quantize_weight
from salon.engine.model.quantize import build_int8_checkpoint, gptq_quantize
from salon.engine.model.synthetic import synthetic_weights
from salon.kernels.backend import select_ops
from salon.kernels.w8a8_gemm import w8a8_gemm_ref


def _weight(n=24, k=96, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.logspace(-2, 1, k)[None, :]  # groups of very different ranges
    w[3, 32:64] = 0.0  # an all-zero group: scale 0, values 0
    return w


def test_grouped_grid_is_the_ceilings_grid_and_beats_per_row():
    w = _weight()
    q, s = quantize_weight(w, 32)
    assert q.dtype == torch.int8 and s.shape == (24, 3) and s[3, 1] == 0 and (q[3, 32:64] == 0).all()
    deq = dequantize_weight(q, s)
    keep = torch.ones(24, dtype=torch.bool)
    keep[3] = False
    assert torch.equal(deq[keep], fake_quantize(w[keep], 32))  # the grid the ceilings measured, bit for bit
    assert (q.view(24, 3, 32).abs().amax(-1)[s > 0] == 127).all()
    row_err = (dequantize_weight(*quantize_weight(w)) - w)[:, :32].pow(2).sum()
    assert (deq - w)[:, :32].pow(2).sum() < row_err / 10  # per-32 scales follow a small group's range
    with pytest.raises(ValueError, match="multiple of 32|divisible by 32"):
        quantize_weight(torch.randn(4, 48), 32)


def test_int8_linear_serves_grouped_scales_with_the_grouped_contract():
    w = _weight()
    q, s = quantize_weight(w, 32)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(1))
    ops = select_ops("cpu")
    one = Int8Linear(q, s, ops.w8a8_gemm, quantize=ops.quantize_per_token)
    a_q, a_s = ops.quantize_per_token(x)
    assert torch.equal(one(x), w8a8_gemm_ref(a_q, a_s, q, s))
    two = Int8Linear(q, s, ops.w8a8_gemm, quantize=ops.quantize_per_token, activation_terms=2)
    exact = x @ dequantize_weight(q, s).T
    assert (two(x) - exact).abs().max() < (one(x) - exact).abs().max()  # ~14-bit activations
    with pytest.raises(ValueError, match=r"\[N, K/32\]"):
        Int8Linear(q, s[:, :2], ops.w8a8_gemm)


def test_grouped_token_table_lookup():
    table = _weight(n=50, k=64, seed=2)
    q, s = quantize_weight(table, 32)
    ids = torch.tensor([0, 7, 7, 49, 3])
    assert torch.equal(Embedding(q, s).lookup(ids), dequantize_weight(q, s)[ids])


def test_weight_group_checkpoint_holds_grouped_scales_everywhere(int8_model):
    config = synthetic_config("synthetic-tiny")
    w = synthetic_weights(config)
    calib = calibrate_float(config, w, calibration_sequences(config, w, int8_model[1]))
    ckpt = build_int8_checkpoint(config, w, calib, alpha=0.5, lm_head_alpha=0.5, weight_group=32)
    for name, t in ckpt.items():
        if name.endswith(".w_scale"):
            n, k = ckpt[name[: -len("w_scale")] + "w_q"].shape
            assert tuple(t.shape) == (n, k // 32), name
    model = build_int8_model(config, ckpt, select_ops("cpu"))
    assert all(getattr(layer, n).w_scale.dim() == 2 for layer in model.layers for n in FUSED)
    assert model.lm_head.w_scale.dim() == 2 and model.embed.row_scale.dim() == 2


def test_grouped_gptq_keeps_the_group_scales_and_lowers_the_output_error():
    gen = torch.Generator().manual_seed(0)
    k, n, r = 96, 40, 400
    mix = torch.randn(k, k, generator=gen) / k**0.5 + torch.eye(k)  # correlated input channels
    x = torch.randn(r, k, generator=gen) @ mix * torch.linspace(0.2, 3.0, k)
    weight = torch.randn(n, k, generator=gen) * torch.logspace(-1, 0.5, k)
    q_near, s_near = quantize_weight(weight, 32)
    q_gptq, s_gptq = gptq_quantize(weight, x, damp=0.01, group=32)
    assert q_gptq.dtype == torch.int8 and torch.equal(s_gptq, s_near) and not torch.equal(q_gptq, q_near)
    err_near = (x @ (weight - dequantize_weight(q_near, s_near)).T).pow(2).sum()
    err_gptq = (x @ (weight - dequantize_weight(q_gptq, s_gptq)).T).pow(2).sum()
    assert err_gptq < 0.7 * err_near
