"""Assembling a CausalLM from named tensors: float weights (from the GGUF) or an int8 checkpoint.

Float weight names (GGUF names, shortened; models/*.py map the file's names onto them): embed, final_norm,
lm_head (untied files only), rope_freqs (Llama 3 files only), layers.{i}.{attn_norm, attn_q, attn_k, attn_v,
attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down} and, for Gemma 3, layers.{i}.{attn_q_norm, attn_k_norm,
post_attention_norm, post_ffw_norm}; Linear weights are [out_features, in_features].
The layers see fused projections: layers.{i}.qkv (q, k, v rows; q only for a KV-sharing layer), .o,
.gate_up (gate rows, then up rows), .down. Int8 checkpoint names: those fused names + .w_q / .w_scale,
embed.w_q / embed.w_scale (and lm_head.* when untied), the norms as above (smoothing folded in), and
embed.lookup_scale when the tied table carries the output projection's smoothing (layers.Embedding).
"""

from __future__ import annotations

import torch

from salon.engine.model.config import ModelConfig
from salon.engine.model.layers import Embedding
from salon.engine.model.linear import FloatLinear, Int8Linear
from salon.engine.model.model import CausalLM
from salon.kernels.backend import Ops

FUSED = ("qkv", "o", "gate_up", "down")


def fused_float_weights(config: ModelConfig, w: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    """The four fused projections of layer i as float [N, K] matrices."""
    p = f"layers.{i}."
    shares = config.layers[i].kv_source_layer is not None
    qkv = w[p + "attn_q"] if shares else torch.cat([w[p + "attn_q"], w[p + "attn_k"], w[p + "attn_v"]])
    return {
        "qkv": qkv,
        "o": w[p + "attn_output"],
        "gate_up": torch.cat([w[p + "ffn_gate"], w[p + "ffn_up"]]),
        "down": w[p + "ffn_down"],
    }


class FloatWeights:
    """Float32 tensors by name; linear() builds FloatLinears of the fused projections."""

    precision = "float32"
    numerics = "float32"

    def __init__(self, config: ModelConfig, w: dict[str, torch.Tensor]) -> None:
        self.config = config
        self.w = w

    def tensor(self, name: str) -> torch.Tensor | None:
        return self.w.get(name)

    def linear(self, name: str, gate_activation: str | None = None) -> FloatLinear:
        layer, _, part = name.rpartition(".")
        if layer.startswith("layers."):
            return FloatLinear(
                fused_float_weights(self.config, self.w, int(layer.split(".")[1]))[part], gate_activation
            )
        return FloatLinear(self.w[name], gate_activation)

    def embedding(self) -> Embedding:
        return Embedding(self.w["embed"])


class Int8Weights:
    """An int8 checkpoint; linear() builds Int8Linears on the kernel ops' W8A8 GEMM."""

    precision = "int8"

    def __init__(
        self,
        ckpt: dict[str, torch.Tensor],
        kernel_ops: Ops,
        quantize_activations: bool = True,
        activation_terms: int | dict[str, int] = 1,
        int16_activations: bool = False,
        group32_activations: bool | tuple[str, ...] = False,
        rescored: tuple[str, ...] = (),
    ) -> None:
        self.ckpt = ckpt
        self.kernel_ops = kernel_ops
        self.quantize_activations = quantize_activations
        self.activation_terms = activation_terms
        # Linears of two int8 terms take one int16 term instead (salon.kernels.w16a8_grouped); one-term ones stay int8
        self.int16_activations = int16_activations
        # Linears with one int8 term per token and 32 channels (salon.kernels.w8a8_group32): all, or those of the
        # named projections ("qkv", "o", "gate_up", "down", "lm_head"); the others keep their terms
        self.group32_activations = group32_activations
        if int16_activations and group32_activations:
            raise ValueError("int16 and group32 activations are two recipes: choose one")
        # Linears of the named projections that run group32 with the rows that could be the largest under two terms
        # rescored with them (salon.kernels.linear_rescored: the output projection of the group32 recipe)
        self.rescored = rescored
        # what decides the model's numbers beyond the checkpoint (part of the KV cache namespace)
        if group32_activations is True:
            self.numerics = "int8-a8g32"
        elif group32_activations:
            self.numerics = "int8-a8g32:" + ",".join(sorted(group32_activations))
        else:
            self.numerics = "int8-a16" if int16_activations else "int8"
        if rescored:
            self.numerics += ";rescored:" + ",".join(sorted(rescored))

    def tensor(self, name: str) -> torch.Tensor | None:
        return self.ckpt.get(name)

    def linear(self, name: str, gate_activation: str | None = None) -> Int8Linear:
        rescored = _projection(name) in self.rescored
        group32 = self.group32_of(name) and not rescored
        terms = 1 if group32 else self.terms_of(name)
        int16 = self.int16_activations and terms == 2
        return Int8Linear(
            self.ckpt[name + ".w_q"],
            self.ckpt[name + ".w_scale"],
            self.kernel_ops.w8a8_gemm,
            gate_activation=gate_activation,
            quantize_activations=self.quantize_activations,
            quantize=self.kernel_ops.quantize_per_token,
            activation_terms=1 if int16 else terms,
            quantize_two_terms=self.kernel_ops.quantize_two_terms,
            linear_two_terms=self.kernel_ops.linear_two_terms,
            geglu=self.kernel_ops.geglu,
            swiglu=self.kernel_ops.swiglu,
            int16_activations=int16,
            linear_int16=self.kernel_ops.linear_int16,
            group32_activations=group32,
            linear_group32=self.kernel_ops.linear_group32,
            rescored=rescored,
            linear_rescored=self.kernel_ops.linear_rescored,
        )

    def terms_of(self, name: str) -> int:
        """int8 terms per activation of Linear `name` (a number for all, or per projection: "down", "lm_head")."""
        if isinstance(self.activation_terms, int):
            return self.activation_terms
        return self.activation_terms.get(_projection(name), 1)

    def group32_of(self, name: str) -> bool:
        """Whether Linear `name` takes one int8 term per token and 32 channels."""
        if isinstance(self.group32_activations, bool):
            return self.group32_activations
        return _projection(name) in self.group32_activations

    def embedding(self) -> Embedding:
        return Embedding(self.ckpt["embed.w_q"], self.ckpt["embed.w_scale"], self.ckpt.get("embed.lookup_scale"))


def _projection(name: str) -> str:
    """The projection a Linear's checkpoint name stands for: "qkv", "o", "gate_up", "down" or "lm_head"."""
    return name.rpartition(".")[2] if name.startswith("layers.") else "lm_head"


def build_model(config: ModelConfig, weights: FloatWeights | Int8Weights, kernel_ops: Ops) -> CausalLM:
    from salon.engine.model.models import architecture

    arch = architecture(config.architecture)
    layers = [arch.build_layer(config, i, weights, kernel_ops) for i in range(config.num_layers)]
    lm_head = weights.linear("embed" if config.tied_embeddings else "lm_head")
    return CausalLM(
        config,
        weights.embedding(),
        layers,
        weights.tensor("final_norm"),
        lm_head,
        weights.precision,
        kernel_ops,
        numerics=weights.numerics,
    )


def build_float_model(config: ModelConfig, w: dict[str, torch.Tensor], kernel_ops: Ops) -> CausalLM:
    return build_model(config, FloatWeights(config, w), kernel_ops)


def build_int8_model(
    config: ModelConfig, ckpt: dict[str, torch.Tensor], kernel_ops: Ops, quantize_activations: bool = True
) -> CausalLM:
    from salon.engine.model.models import architecture

    arch = architecture(config.architecture)
    int16 = kernel_ops.activations == "int16"
    # group32: the architecture's INT8_GROUP32_RECIPE Linears, its INT8_GROUP32_RESCORED ones rescored; the others
    # keep INT8_ACTIVATION_TERMS
    group32 = tuple(arch.INT8_GROUP32_RECIPE) if kernel_ops.activations == "group32" else False
    rescored = tuple(arch.INT8_GROUP32_RESCORED) if group32 else ()
    weights = Int8Weights(ckpt, kernel_ops, quantize_activations, arch.INT8_ACTIVATION_TERMS, int16, group32, rescored)
    return build_model(config, weights, kernel_ops)
