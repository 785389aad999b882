"""Where the int8 model's error comes from: ceilings measured by fake quantization (bench/quant_eval.py --ceilings).

Each ceiling is a model in which one part is quantized (rounded and scaled back to float32, the matmul in
float32) and the rest is exact, or the engine's int8 model with one part replaced by exact math. They are
measurements, not serving paths: nothing here is batch-invariant by construction or fast, and the engine never
runs them. What they answer: how good a top-1 / log-prob error each part allows, so that the kernel work a
recipe would need (group-scaled weights, finer activations, finer KV scales) is chosen by its payoff.

Weight groups: symmetric int8 with one scale per `group` consecutive input channels of an output row (a group
equal to the row is the shipped per-output-channel scale). The GGUF's token table is Q8_0 (int8 per block of
32 with one scale each), its q/k/gate/up Q5_0 and half its v Q8_0, so per-32 groups lose far less than a scale
per row; the other tensors are Q4_K/Q6_K.
"""

from __future__ import annotations

import dataclasses

import torch

from salon.engine.model.builder import FUSED, build_int8_model
from salon.engine.model.checkpoint import calibrate_and_quantize
from salon.engine.model.linear import FloatLinear
from salon.kernels.quantize import SCALE_FLOOR


def fake_quantize(x: torch.Tensor, group: int) -> torch.Tensor:
    """f32[N, K] -> the same values through symmetric int8 with one scale per `group` columns (K % group == 0),
    round half to even, scale = max(absmax / 127, SCALE_FLOOR) as salon.kernels.quantize."""
    n, k = x.shape
    g = x.reshape(n, k // group, group)
    scale = (g.abs().amax(-1, keepdim=True) / 127).clamp_min(SCALE_FLOOR)
    return (torch.round(g / scale).clamp(-127, 127) * scale).reshape(n, k)


class FakeQuantLinear(FloatLinear):
    """A FloatLinear whose weights were fake-quantized at construction (weight_group: 0 = one scale per output
    row, N = per N input channels, None = exact) and whose input is fake-quantized per token as
    `activation_terms` int8 terms (0: float; 2: the residual of the first term quantized again, as linear.py)."""

    def __init__(
        self, weight: torch.Tensor, gate_activation: str | None, weight_group: int | None, activation_terms: int
    ) -> None:
        if weight_group is not None:
            weight = fake_quantize(weight, weight.shape[1] if weight_group == 0 else weight_group)
        super().__init__(weight, gate_activation)
        self.activation_terms = activation_terms

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation_terms:
            q = fake_quantize(x, x.shape[1])
            x = q if self.activation_terms == 1 else q + fake_quantize(x - q, x.shape[1])
        return super().__call__(x)


def fake_quantize_float_model(model, weight_group: int | None, activation_terms: int):
    """In place on a float32 CausalLM: every projection and the output projection fake-quantized."""
    for layer in model.layers:
        for name in FUSED:
            lin = getattr(layer, name)
            setattr(layer, name, FakeQuantLinear(lin.weight, lin.gate_activation, weight_group, activation_terms))
    model.lm_head = FakeQuantLinear(model.lm_head.weight, None, weight_group, activation_terms)
    return model


def shipped_recipe_with_weight_groups(
    config, w: dict[str, torch.Tensor], tokenizer, kernel_ops, weight_group: int, activation_terms: int | None = None
):
    """The architecture's shipped recipe (its calibration, smoothing and activation terms) with the smoothed
    weights fake-quantized per `weight_group` input channels, rounded to nearest (GPTQ, where the recipe
    has it, is not applied), the activations fake-quantized as the engine's two-term recipe quantizes them
    (or as `activation_terms` int8 terms everywhere)."""
    smoothed: dict[str, torch.Tensor] = {}
    ckpt = calibrate_and_quantize(config, w, tokenizer, rounding="nearest", smoothed_weights=smoothed)
    model = build_int8_model(config, ckpt, dataclasses.replace(kernel_ops, activations="two_terms"))
    for i, layer in enumerate(model.layers):
        for name in FUSED:
            lin = getattr(layer, name)
            setattr(
                layer,
                name,
                FakeQuantLinear(
                    smoothed[f"layers.{i}.{name}"],
                    lin.gate_activation,
                    weight_group,
                    activation_terms or lin.activation_terms,
                ),
            )
    head = "embed" if config.tied_embeddings else "lm_head"
    model.lm_head = FakeQuantLinear(
        smoothed[head], None, weight_group, activation_terms or model.lm_head.activation_terms
    )
    return model


def exact_output_projection(int8_model, float_weights: dict[str, torch.Tensor]):
    """In place on the engine's int8 model (tied table): the output projection and the final norm back to the
    GGUF's float values (the checkpoint folds the projection's smoothing into both), the layers untouched."""
    int8_model.lm_head = FloatLinear(float_weights["embed"])
    int8_model.final_norm = float_weights["final_norm"]
    return int8_model


def float_activations(int8_model):
    """In place on the engine's int8 model: int8 weights, float32 activations (weight-only int8)."""
    for layer in int8_model.layers:
        for name in FUSED:
            getattr(layer, name).quantize_activations = False
    int8_model.lm_head.quantize_activations = False
    return int8_model
