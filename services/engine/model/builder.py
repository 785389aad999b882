"""Assembling a CausalLM from named tensors: float weights (from the GGUF) or an int8 checkpoint.

Float weight names (GGUF names, shortened): embed, final_norm, layers.{i}.{attn_norm, attn_q, attn_k,
attn_v, attn_q_norm, attn_k_norm, attn_output, post_attention_norm, ffn_norm, ffn_gate, ffn_up,
ffn_down, post_ffw_norm}; Linear weights are [out_features, in_features].
Int8 checkpoint names: the norms as above (smoothing folded in), embed.w_q/embed.w_scale and
layers.{i}.{qkv,o,gate_up,down}.{w_q,w_scale}.
"""

from __future__ import annotations

import torch

from kernels.backend import Ops
from services.engine.model.config import ModelConfig
from services.engine.model.linear import FloatLinear, Int8Linear
from services.engine.model.model import CausalLM, Embedding, LayerWeights

NORMS = ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")


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


def build_float_model(config: ModelConfig, w: dict[str, torch.Tensor], kernel_ops: Ops) -> CausalLM:
    layers = []
    for i in range(config.num_layers):
        p = f"layers.{i}."
        fused = fused_float_weights(config, w, i)
        layers.append(LayerWeights(
            attn_norm=w[p + "attn_norm"], qkv=FloatLinear(fused["qkv"]), q_norm=w[p + "attn_q_norm"],
            k_norm=w.get(p + "attn_k_norm"), o=FloatLinear(fused["o"]),
            post_attention_norm=w[p + "post_attention_norm"], ffn_norm=w[p + "ffn_norm"],
            gate_up=FloatLinear(fused["gate_up"], geglu=True), down=FloatLinear(fused["down"]),
            post_ffw_norm=w[p + "post_ffw_norm"]))
    embed = Embedding(w["embed"])
    return CausalLM(config, embed, layers, w["final_norm"], FloatLinear(w["embed"]), "float32", kernel_ops)


def build_int8_model(config: ModelConfig, ckpt: dict[str, torch.Tensor], kernel_ops: Ops,
                     quantize_activations: bool = True) -> CausalLM:
    gemm = kernel_ops.w8a8_gemm

    def lin(name: str, geglu: bool = False) -> Int8Linear:
        return Int8Linear(ckpt[name + ".w_q"], ckpt[name + ".w_scale"], gemm, geglu=geglu,
                          quantize_activations=quantize_activations, quantize=kernel_ops.quantize_per_token)

    layers = []
    for i in range(config.num_layers):
        p = f"layers.{i}."
        layers.append(LayerWeights(
            attn_norm=ckpt[p + "attn_norm"], qkv=lin(p + "qkv"), q_norm=ckpt[p + "attn_q_norm"],
            k_norm=ckpt.get(p + "attn_k_norm"), o=lin(p + "o"), post_attention_norm=ckpt[p + "post_attention_norm"],
            ffn_norm=ckpt[p + "ffn_norm"], gate_up=lin(p + "gate_up", geglu=True), down=lin(p + "down"),
            post_ffw_norm=ckpt[p + "post_ffw_norm"]))
    embed = Embedding(ckpt["embed.w_q"], ckpt["embed.w_scale"])
    return CausalLM(config, embed, layers, ckpt["final_norm"], lin("embed"), "int8", kernel_ops)
