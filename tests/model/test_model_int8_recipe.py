"""The int8 conversion's recipe pieces (quantize.py) on small models, and that the shipped Gemma checkpoint uses them.

- output-projection smoothing: the tied table holds E * s, the lookup multiplies by 1 / s, so every looked-up
  row is E's row within one int8 step of that row; the lm_head's function (final_norm / s times E * s) is
  unchanged before rounding;
- GPTQ rounding keeps round-to-nearest's scales and format and lowers the output error on its calibration
  rows;
- the engine's Gemma model carries the shipped recipe (grouped weight scales everywhere, two int8 terms per
  activation everywhere, or one int16 term where the kernel family runs that recipe, no projection smoothing).
"""

from __future__ import annotations

import torch

from bench.quant_ceilings import shipped_recipe_with_weight_groups
from salon.engine.model import synthetic_config
from salon.engine.model.builder import FUSED, build_int8_model
from salon.engine.model.checkpoint import calibrate_and_quantize, calibrate_float, calibration_sequences
from salon.engine.model.linear import dequantize_weight, quantize_weight
from salon.engine.model.models import architecture
from salon.engine.model.quantize import build_int8_checkpoint, gptq_quantize
from salon.engine.model.synthetic import synthetic_weights
from salon.kernels.backend import select_ops
from tests.model.conftest import gemma_served_activations


def _tiny(int8_model):
    config = synthetic_config("synthetic-tiny")
    w = synthetic_weights(config)
    calib = calibrate_float(config, w, calibration_sequences(config, w, int8_model[1]))
    return config, w, calib


def test_lm_head_smoothing_keeps_the_input_embeddings(int8_model):
    config, w, calib = _tiny(int8_model)
    assert calib.inputs["lm_head"].shape[1] == config.d_model
    ckpt = build_int8_checkpoint(config, w, calib, alpha=0.5, lm_head_alpha=0.5)
    s_inv = ckpt["embed.lookup_scale"]
    assert not torch.allclose(s_inv, torch.ones_like(s_inv))  # a real per-channel scale
    model = build_int8_model(config, ckpt, select_ops("cpu"))
    ids = torch.arange(0, config.vocab_size, 997)
    rows = model.embed.lookup(ids)
    step = ckpt["embed.w_scale"][ids][:, None] * s_inv[None, :]  # one int8 step of each looked-up element
    assert ((rows - w["embed"][ids]).abs() <= 0.5 * step * (1 + 1e-5)).all()
    # the output projection: final_norm / s against (E * s), the same product as final_norm against E
    s = 1.0 / s_inv
    assert torch.allclose(ckpt["final_norm"] * s, w["final_norm"], rtol=1e-6)
    plain = build_int8_checkpoint(config, w, calib, alpha=0.5)
    assert "embed.lookup_scale" not in plain and torch.equal(plain["final_norm"], w["final_norm"])


def test_gptq_keeps_the_format_and_lowers_the_output_error():
    gen = torch.Generator().manual_seed(0)
    k, n, r = 96, 40, 400
    mix = torch.randn(k, k, generator=gen) / k**0.5 + torch.eye(k)  # correlated input channels
    x = torch.randn(r, k, generator=gen) @ mix * torch.linspace(0.2, 3.0, k)
    weight = torch.randn(n, k, generator=gen)
    q_near, s_near = quantize_weight(weight)
    q_gptq, s_gptq = gptq_quantize(weight, x, damp=0.01)
    assert q_gptq.dtype == torch.int8 and torch.equal(s_gptq, s_near)
    exact = x @ weight.T

    def err(q, s):
        return (x @ (q.to(torch.float32) * s[:, None]).T - exact).pow(2).sum().item()

    assert err(q_gptq, s_gptq) < 0.7 * err(q_near, s_near)


def test_the_gemma_checkpoint_carries_the_shipped_recipe(int8_model):
    arch = architecture("gemma3")
    assert arch.INT8_RECIPE.get("weight_group") == 32 and arch.INT8_RECIPE.get("rounding", "nearest") == "nearest"
    assert arch.INT8_SMOOTH == () and arch.INT8_ACTIVATION_TERMS == 2 and arch.INT8_RECIPE.get("lm_head_alpha") is None
    model = int8_model[0]
    linears = [getattr(layer, n) for layer in model.layers for n in FUSED] + [model.lm_head]
    # one scale per output row and 32 input channels in every matrix and in the token table
    assert all(lin.w_scale.shape == (lin.w_q.shape[0], lin.w_q.shape[1] // 32) for lin in linears)
    assert model.embed.row_scale.shape == (model.config.vocab_size, model.config.d_model // 32)
    assert model.embed.channel_scale is None  # no output-projection smoothing
    # served with group32 activations on VNNI (salon.engine.model.activation_recipe): one int8 term per token and 32
    # channels in the decoder layers' Linears, two int8 terms in the output projection; one int16 term on AVX2
    assert model.kernel_ops.activations == gemma_served_activations() and arch.INT8_GROUP32_RECIPE == FUSED
    if model.kernel_ops.activations == "int16":
        assert all(lin.int16_activations and not lin.group32_activations for lin in linears)
        return
    assert all(lin.fuses() and not lin.int16_activations for lin in linears)
    assert all(lin.group32_activations and lin.activation_terms == 1 for lin in linears[:-1])
    assert not model.lm_head.group32_activations and model.lm_head.activation_terms == 2


def test_smoothed_weights_are_what_the_checkpoint_rounds(int8_model):
    """build_int8_checkpoint(smoothed_weights=...) hands out each matrix as it is rounded: round to nearest of
    it is the checkpoint's int8 tensor, and it differs from the unsmoothed float weights."""
    config, w, calib = _tiny(int8_model)
    smoothed: dict[str, torch.Tensor] = {}
    ckpt = build_int8_checkpoint(config, w, calib, alpha=0.5, lm_head_alpha=0.5, smoothed_weights=smoothed)
    names = {k[: -len(".w_q")] for k in ckpt if k.endswith(".w_q")}
    assert set(smoothed) == names
    for name, weight in smoothed.items():
        q, s = quantize_weight(weight)
        assert torch.equal(q, ckpt[name + ".w_q"]) and torch.equal(s, ckpt[name + ".w_scale"]), name
    assert not torch.equal(smoothed["embed"], w["embed"])
    assert not torch.equal(smoothed["layers.0.gate_up"], torch.cat([w["layers.0.ffn_gate"], w["layers.0.ffn_up"]]))


def test_the_ceilings_rerun_the_shipped_recipe_on_its_smoothed_weights(int8_model):
    """bench/quant_ceilings.py's shipped-recipe rows: every projection's fake-quantized weights are exactly the
    recipe's round-to-nearest checkpoint, dequantized, for one scale per row and for the shipped 32-channel
    groups; the activation terms are the architecture's."""
    config = synthetic_config("synthetic-tiny")
    w = synthetic_weights(config)
    tok = int8_model[1]
    for group in (0, 32):
        ckpt = calibrate_and_quantize(config, w, tok, rounding="nearest", weight_group=group)
        model = shipped_recipe_with_weight_groups(config, w, tok, select_ops("cpu"), group)

        def dequantized(name):
            return dequantize_weight(ckpt[name + ".w_q"], ckpt[name + ".w_scale"])

        for i, layer in enumerate(model.layers):
            for name in FUSED:
                assert torch.equal(getattr(layer, name).weight, dequantized(f"layers.{i}.{name}")), (group, i, name)
        assert torch.equal(model.lm_head.weight, dequantized("embed"))
        assert torch.equal(model.final_norm, ckpt["final_norm"])
    # the ceilings model the two-term recipe (bench/quant_ceilings.py)
    shipped = build_int8_model(
        config, calibrate_and_quantize(config, w, tok), select_ops("cpu", activations="two_terms")
    )
    for i, layer in enumerate(model.layers):
        for name in FUSED:
            assert getattr(layer, name).activation_terms == getattr(shipped.layers[i], name).activation_terms
    assert model.lm_head.activation_terms == shipped.lm_head.activation_terms
    one_term = shipped_recipe_with_weight_groups(config, w, tok, select_ops("cpu"), 32, 1)
    assert {layer.gate_up.activation_terms for layer in one_term.layers} == {1}
