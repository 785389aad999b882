"""Float weights -> int8 checkpoint, with SmoothQuant-style smoothing folded into the weights.

Smoothing moves activation outliers into the weights channel by channel: for a Linear whose input
column j has calibration magnitude a_j (rms over the calibration rows by default, see
DEFAULT_STATISTIC) and whose weight column j has absmax w_j,
    s_j = a_j^alpha / w_j^(1 - alpha),   X' = X / s,   W' = W * s   (X' W'^T == X W^T exactly).
The division by s is folded into what produces X, so the int8 model runs no extra op:
    qkv input     <- attn_norm weight (RMSNorm output is x_hat * w)
    gate/up input <- ffn_norm weight
    down input    <- the up projection's rows (gelu(gate) * up is linear in up)
    o input       <- the v projection's rows (attention output is a convex mix of v rows; one s per
                     head_dim channel, shared by all query heads reading that KV head)
The int8 KV cache is smoothed the same way: keys are scaled per channel and queries (which stay float) by
the inverse, so every score q.k is unchanged. Where the architecture has per-head q/k norms (Gemma 3) the
scales go into the k-norm and q-norm weights (one scale per head_dim channel); where it has none (Llama)
they go into the k rows of the qkv projection and the inverse into the q rows of the query heads that read
that KV head (one scale per KV head and channel; a row scale leaves a per-row int8 quantization exact).
RoPE rotates channel pairs (j, j + D/2), so both channels of a pair share one scale, taken from the
pair's rotation-invariant magnitude sqrt(k_j^2 + k_{j+D/2}^2).
The output projection (lm_head_alpha) is smoothed the same way: its input is rmsnorm(x, final_norm), so
s goes into final_norm (/ s) and into the projection's columns (* s). When the projection is the tied
embedding table, the table holds E * s (quantized per row) and the lookup multiplies each row by 1 / s
(`embed.lookup_scale`, d_model multiplies per token), so the input embeddings are unchanged.
Weights are then quantized symmetric per output channel (or, weight_group=32, per output channel and group
of 32 input channels: the grid of GGUF's Q8_0, about 3x less rounding error), rounded to nearest or
(rounding="gptq") with GPTQ's error compensation: the scales stay absmax / 127 (per row or group),
only the rounding direction of each weight changes, chosen column by column so that the layer's output on
the calibration rows (in the smoothed model) moves as little as possible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from salon.engine.model.builder import fused_float_weights
from salon.engine.model.config import ModelConfig
from salon.engine.model.linear import FloatLinear, quantize_weight
from salon.engine.model.model import CausalLM
from salon.engine.model.models import architecture
from salon.engine.model.ops import quantize_symmetric
from salon.kernels.rmsnorm import rmsnorm_ref

DEFAULT_ALPHA = 0.5
# Key smoothing strength: s_pair = magnitude^-KV_BETA (0: none, 1: every pair flattened to one absmax).
DEFAULT_KV_BETA = 0.6


class _AbsMaxRecorder:
    """Wraps a Linear and keeps the running per-input-channel absmax of what it is fed.

    Row 0 (the BOS position of a calibration sequence) is left out: its activations are orders of
    magnitude larger in a few channels (an attention sink); per-token quantization gives that row
    its own scale anyway, and letting it drive the smoothing would ruin every other row.
    """

    def __init__(self, inner: FloatLinear) -> None:
        self.inner = inner
        self.absmax: torch.Tensor | None = None
        self.rows: list[torch.Tensor] = []
        self.gate_activation = inner.gate_activation

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < 2:
            return self.inner(x)
        self.rows.append(x[1:].clone())
        m = x[1:].abs().amax(dim=0)
        self.absmax = m if self.absmax is None else torch.maximum(self.absmax, m)
        return self.inner(x)

    def nbytes(self) -> int:
        return self.inner.nbytes()


@dataclass
class Calibration:
    absmax: dict[str, torch.Tensor]  # per projection: absmax of each input channel
    inputs: dict[str, torch.Tensor]  # per projection: the calibration rows it was fed [R, K]

    def rms(self, name: str) -> torch.Tensor:
        """Root-mean-square of each input channel of projection ``name`` over the calibration rows."""
        return self.inputs[name].pow(2).mean(dim=0).sqrt()


def calibrate(model: CausalLM, run: Callable[[CausalLM], list[torch.Tensor] | None]) -> Calibration:
    """Per layer and projection, what reaches each input channel while ``run(model)`` executes.

    When ``run`` returns the final hidden states of its sequences, they are the output projection's rows
    ("lm_head"; each sequence's BOS row left out like every other projection's).
    """
    recorders: dict[str, _AbsMaxRecorder] = {}
    originals = []
    for i, lw in enumerate(model.layers):
        for name in ("qkv", "o", "gate_up", "down"):
            rec = _AbsMaxRecorder(getattr(lw, name))
            originals.append((lw, name, rec.inner))
            setattr(lw, name, rec)
            recorders[f"layers.{i}.{name}"] = rec
    try:
        hidden = run(model)
    finally:
        for lw, name, inner in originals:
            setattr(lw, name, inner)
    done = {k: r for k, r in recorders.items() if r.absmax is not None}
    calib = Calibration({k: r.absmax for k, r in done.items()}, {k: torch.cat(r.rows) for k, r in done.items()})
    if hidden:
        rows = torch.cat([h[1:] for h in hidden])
        calib.inputs["lm_head"], calib.absmax["lm_head"] = rows, rows.abs().amax(dim=0)
    return calib


def _fake_quant_rows(x: torch.Tensor) -> torch.Tensor:
    q, scale = quantize_symmetric(x, dim=1)
    return q.to(torch.float32) * scale[:, None]


def _best_alpha(
    x: torch.Tensor, weight: torch.Tensor, act_absmax: torch.Tensor, alphas: tuple[float, ...], expand
) -> float:
    """The alpha whose smoothing minimises the W8A8 output error on the calibration rows x."""
    exact = x @ weight.T
    best, best_err = 0.0, float("inf")
    for alpha in alphas:
        s = expand(_smooth_scale(act_absmax, weight, alpha))
        approx = _fake_quant_rows(x / s) @ _fake_quant_rows(weight * s).T
        err = (approx - exact).pow(2).sum().item()
        if err < best_err:
            best, best_err = alpha, err
    return best


def _smooth_scale(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """One scale per input channel (act_absmax may be coarser: [Hkv, D] for the o projection)."""
    w_absmax = weight.abs().amax(dim=0)
    if act_absmax.shape != w_absmax.shape:
        w_absmax = w_absmax.reshape(act_absmax.shape[0], -1, act_absmax.shape[1]).amax(dim=1)
    s = act_absmax.clamp(min=1e-5).pow(alpha) / w_absmax.clamp(min=1e-5).pow(1.0 - alpha)
    return s.clamp(min=1e-5)


ALPHA_GRID = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
# The activation magnitude a_j of the smoothing formula. Per-token quantization gives each token its
# own scale, so a channel that is large on a handful of tokens only (absmax) should not be shrunk for
# all of them; the typical magnitude (rms over the calibration rows) is what sets most tokens' scales.
SMOOTH_STATISTICS = ("rms", "absmax")
DEFAULT_STATISTIC = "rms"


def key_smoothing_scale(
    config: ModelConfig, w: dict[str, torch.Tensor], qkv_inputs: torch.Tensor, layer: int, beta: float
) -> torch.Tensor:
    """f32[head_dim]: the per-channel key scale of a KV-producing layer (equal on each RoPE pair).

    qkv_inputs are the calibration rows fed to the layer's qkv projection (before any smoothing);
    the keys are rebuilt from them up to the k-norm (RoPE leaves pair magnitudes unchanged).
    """
    p = f"layers.{layer}."
    hkv, d = config.num_kv_heads, config.head_dim
    k = (qkv_inputs @ w[p + "attn_k"].T).reshape(-1, hkv, d)
    k = rmsnorm_ref(k, w[p + "attn_k_norm"], config.rms_norm_eps)
    half = d // 2
    pair = torch.sqrt(k[..., :half] ** 2 + k[..., half:] ** 2).amax(dim=(0, 1))  # [D/2], all KV heads
    s = pair.clamp(min=1e-4).pow(-beta)
    s = s / s.mean()  # per-token quantization ignores a common factor; keep magnitudes near the original
    return torch.cat([s, s])


def key_row_scale(
    config: ModelConfig, w: dict[str, torch.Tensor], qkv_inputs: torch.Tensor, layer: int, beta: float
) -> torch.Tensor:
    """f32[Hkv, head_dim]: per KV head and channel, the key scale of a layer without q/k norms (equal on each
    RoPE pair), from the keys the calibration rows produce (k rows in half-split order)."""
    hkv, d = config.num_kv_heads, config.head_dim
    k = (qkv_inputs @ w[f"layers.{layer}.attn_k"].T).reshape(-1, hkv, d)
    half = d // 2
    pair = torch.sqrt(k[..., :half] ** 2 + k[..., half:] ** 2).amax(dim=0)  # [Hkv, D/2]
    s = pair.clamp(min=1e-4).pow(-beta)
    s = s / s.mean(dim=1, keepdim=True)
    return torch.cat([s, s], dim=1)


ROUNDINGS = ("nearest", "gptq")
DEFAULT_GPTQ_DAMP = 0.1  # GPTQ's Hessian dampening, a fraction of the mean of its diagonal


def gptq_quantize(
    weight: torch.Tensor,
    rows: torch.Tensor,
    damp: float = DEFAULT_GPTQ_DAMP,
    block: int = 128,
    chunk_n: int = 16384,
    group: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ rounding with quantize_weight's per-row scales: f32[N, K], input rows f32[R, K] -> int8[N, K], f32[N]
    (group = 32: quantize_weight's per-row-and-group scales f32[N, K/32], fixed before the rounding starts).

    Columns are quantized in order of decreasing input energy; each column's rounding error is pushed onto
    the columns not yet quantized, weighted by the inverse of H = X^T X (dampened by damp * mean(diag H)),
    which greedily minimises ||X W^T - X Q^T|| over the calibration rows X. The scales (absmax / 127 per
    row) and so the int8 format are those of round-to-nearest; rows are independent (done chunk_n at a time).
    """
    n, k = weight.shape
    x = rows.to(torch.float64)
    h = x.T @ x
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    h += damp * torch.diag(h).mean() * torch.eye(k, dtype=torch.float64)
    order = torch.argsort(torch.diag(h), descending=True)
    inverse = torch.argsort(order)
    h = h[order][:, order]
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    _, scale = quantize_weight(weight, group)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).to(torch.float64)
    column_scale = safe[:, order // group] if group else safe[:, None].expand(n, k)  # [N, K] in `order`
    q_out = torch.empty((n, k), dtype=torch.int8)
    for n0 in range(0, n, chunk_n):
        w = weight[n0 : n0 + chunk_n].to(torch.float64)[:, order].clone()
        s = column_scale[n0 : n0 + chunk_n]
        q = torch.empty_like(w)
        for b0 in range(0, k, block):
            b1 = min(b0 + block, k)
            err = torch.empty((w.shape[0], b1 - b0), dtype=torch.float64)
            for i in range(b0, b1):
                q[:, i] = torch.clamp(torch.round(w[:, i] / s[:, i]), -127, 127)
                e = (w[:, i] - q[:, i] * s[:, i]) / hinv[i, i]
                w[:, i:b1] -= e[:, None] * hinv[i, i:b1][None, :]
                err[:, i - b0] = e
            w[:, b1:] -= err @ hinv[b0:b1, b1:]
        q_out[n0 : n0 + chunk_n] = q[:, inverse].to(torch.int8)
    return q_out, scale


# Rounds one matrix to (int8 values, scales), given the calibration rows it sees (None: none known).
Rounder = Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]


def check_recipe(calib: Calibration | None, statistic: str, rounding: str, lm_head_alpha: float | None) -> None:
    if statistic not in SMOOTH_STATISTICS:
        raise ValueError(f"statistic must be one of {SMOOTH_STATISTICS}, got {statistic!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if calib is None and (rounding != "nearest" or lm_head_alpha is not None):
        raise ValueError("GPTQ rounding and output-projection smoothing need a calibration")


def rounder(rounding: str, gptq_damp: float, weight_group: int) -> Rounder:
    """GPTQ where the rounding asks for it and the matrix's calibration rows are known; nearest otherwise."""

    def quantize(weight: torch.Tensor, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if rounding == "gptq" and rows is not None:
            return gptq_quantize(weight, rows, damp=gptq_damp, group=weight_group)
        return quantize_weight(weight, weight_group)

    return quantize


def output_projection_tensors(
    config: ModelConfig,
    w: dict[str, torch.Tensor],
    calib: Calibration | None,
    quantize: Rounder,
    statistic: str,
    lm_head_alpha: float | None,
    gptq_rows: bool,
    weight_group: int,
    smoothed_weights: dict[str, torch.Tensor] | None,
) -> dict[str, torch.Tensor]:
    """The final norm, the token table and the output projection (smoothed by lm_head_alpha, when given), and
    the RoPE frequencies when the file has them."""
    out: dict[str, torch.Tensor] = {}
    head = w["embed"] if config.tied_embeddings else w["lm_head"]
    s_head = torch.ones(config.d_model)
    if lm_head_alpha is not None:
        rows = calib.inputs["lm_head"]
        act = rows.pow(2).mean(dim=0).sqrt() if statistic == "rms" else calib.absmax["lm_head"]
        s_head = _smooth_scale(act, head, lm_head_alpha)
    out["final_norm"] = w["final_norm"] / s_head
    head_rows = calib.inputs["lm_head"] / s_head if gptq_rows else None
    head_q = quantize(head * s_head, head_rows)
    if smoothed_weights is not None:
        smoothed_weights["embed" if config.tied_embeddings else "lm_head"] = head * s_head
    if config.tied_embeddings:
        out["embed.w_q"], out["embed.w_scale"] = head_q
        if lm_head_alpha is not None:
            out["embed.lookup_scale"] = 1.0 / s_head
    else:
        out["embed.w_q"], out["embed.w_scale"] = quantize_weight(w["embed"], weight_group)
        out["lm_head.w_q"], out["lm_head.w_scale"] = head_q
    if "rope_freqs" in w:
        out["rope_freqs"] = w["rope_freqs"].clone()
    return out


def layer_smoothing_scales(
    config: ModelConfig,
    calib: Calibration,
    layer: int,
    fused: dict[str, torch.Tensor],
    smooth: tuple[str, ...],
    statistic: str,
    alpha: float | None,
    alpha_by_projection: dict[str, float] | None,
    alphas_chosen: dict[str, float] | None,
) -> dict[str, torch.Tensor]:
    """Per smoothed projection of one layer, the scale of its input channels, from the calibration (the o
    projection's expanded from one per KV head and channel to every query head; not where KV is shared)."""
    p = f"layers.{layer}."
    hq, hkv, d = config.num_heads, config.num_kv_heads, config.head_dim
    group = hq // hkv

    def expand_o(s: torch.Tensor) -> torch.Tensor:  # [Hkv, D] -> [Hq * D] (query heads of a KV head share)
        return s[:, None, :].expand(hkv, group, d).reshape(hq * d)

    shares = config.layers[layer].kv_source_layer is not None
    has_readers = any(spec.kv_source_layer == layer for spec in config.layers)
    scales: dict[str, torch.Tensor] = {}
    for name in smooth:
        if name == "o" and (shares or has_readers):
            continue
        act = calib.rms(p + name) if statistic == "rms" else calib.absmax[p + name]
        expand = (lambda s: s) if name != "o" else expand_o
        if name == "o":
            act = act.reshape(hkv, group, d).amax(dim=1)
        a = (alpha_by_projection or {}).get(name, alpha)
        if a is None:
            a = _best_alpha(calib.inputs[p + name], fused[name], act, ALPHA_GRID, expand)
        if alphas_chosen is not None:
            alphas_chosen[p + name] = a
        scales[name] = expand(_smooth_scale(act, fused[name], a))
    return scales


def apply_smoothing(
    config: ModelConfig, fused: dict[str, torch.Tensor], norms: dict[str, torch.Tensor], scales: dict[str, torch.Tensor]
) -> None:
    """Fold each projection's scales into its weights (* s) and into what produces its input (/ s), in place."""
    hq, hkv, d = config.num_heads, config.num_kv_heads, config.head_dim
    group = hq // hkv
    if "qkv" in scales:
        norms["attn_norm"] /= scales["qkv"]
        fused["qkv"] *= scales["qkv"]
    if "gate_up" in scales:
        norms["ffn_norm"] /= scales["gate_up"]
        fused["gate_up"] *= scales["gate_up"]
    if "down" in scales:
        fused["gate_up"][config.ffn_dim :] /= scales["down"][:, None]
        fused["down"] *= scales["down"]
    if "o" in scales:
        s_v = scales["o"].reshape(hkv, group, d)[:, 0, :]  # the per-(KV head, channel) scale
        fused["qkv"][(hq + hkv) * d :].view(hkv, d, -1).div_(s_v[:, :, None])
        fused["o"] *= scales["o"]


def apply_key_row_scale(
    config: ModelConfig,
    w: dict[str, torch.Tensor],
    calib: Calibration,
    layer: int,
    fused: dict[str, torch.Tensor],
    kv_beta: float,
) -> None:
    """Key smoothing without q/k norms: the k rows of the qkv projection * s, its q rows / s, in place."""
    hq, hkv, d = config.num_heads, config.num_kv_heads, config.head_dim
    s_k = key_row_scale(config, w, calib.inputs[f"layers.{layer}.qkv"], layer, kv_beta)  # [Hkv, D]
    fused["qkv"][hq * d : (hq + hkv) * d].view(hkv, d, -1).mul_(s_k[:, :, None])
    fused["qkv"][: hq * d].view(hkv, hq // hkv, d, -1).div_(s_k[:, None, :, None])


def key_norm_tensors(
    config: ModelConfig,
    w: dict[str, torch.Tensor],
    calib: Calibration | None,
    layer: int,
    kv_beta: float,
    key_scales: dict[int, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Key smoothing through q/k norms: the layer's q-norm / s and, when it produces KV, its k-norm * s, with s
    the scale of the layer whose KV it reads (computed once per KV-producing layer into key_scales)."""
    p = f"layers.{layer}."
    src = config.kv_source(layer)
    if calib is not None and kv_beta > 0 and src not in key_scales:
        key_scales[src] = key_smoothing_scale(config, w, calib.inputs[f"layers.{src}.qkv"], src, kv_beta)
    k_scale = key_scales.get(src, torch.ones(config.head_dim))
    out = {p + "attn_q_norm": w[p + "attn_q_norm"] / k_scale}  # readers of shared KV divide by the source's
    if config.layers[layer].kv_source_layer is None:
        out[p + "attn_k_norm"] = w[p + "attn_k_norm"] * k_scale
    return out


def build_int8_checkpoint(
    config: ModelConfig,
    w: dict[str, torch.Tensor],
    calib: Calibration | None,
    alpha: float | None = None,
    smooth: tuple[str, ...] = ("qkv", "gate_up", "down", "o"),
    alphas_chosen: dict[str, float] | None = None,
    kv_beta: float = DEFAULT_KV_BETA,
    statistic: str = DEFAULT_STATISTIC,
    alpha_by_projection: dict[str, float] | None = None,
    lm_head_alpha: float | None = None,
    rounding: str = "nearest",
    gptq_damp: float = DEFAULT_GPTQ_DAMP,
    gptq_lm_head: bool = True,
    gptq_layers: bool = True,
    weight_group: int = 0,
    smoothed_weights: dict[str, torch.Tensor] | None = None,
    on_quantized: Callable[[str], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Float weights (+ calibration, or None for no smoothing) -> int8 checkpoint tensors.

    alpha None: per projection, the alpha of ALPHA_GRID with the least W8A8 output error on the
    calibration rows (recorded into ``alphas_chosen`` when given); a number: that alpha everywhere;
    alpha_by_projection overrides it per projection name ("qkv", "o", "gate_up", "down").
    statistic: the per-channel activation magnitude the scales use (one of SMOOTH_STATISTICS).
    lm_head_alpha: smoothing of the output projection (None: none; needs the calibration's "lm_head" rows).
    rounding: "nearest" or "gptq" (needs calibration; gptq_lm_head False keeps the output projection nearest,
    gptq_layers False the decoder layers' Linears).
    weight_group: 0 for one scale per output row, GROUP (32) for one per row and 32 input channels (every
    matrix and the token table; GPTQ keeps those scales and chooses the rounding).
    smoothed_weights, when given, receives each quantized matrix as float32 before rounding (smoothing applied),
    by its checkpoint name without ".w_q" ("embed" or "lm_head" for the output projection; bench/quant_ceilings.py).
    on_quantized, when given, is called as each part is done: with "output" once the output projection is, then
    with "layers.{i}." once layer i is (a conversion's progress).
    """
    check_recipe(calib, statistic, rounding, lm_head_alpha)
    arch = architecture(config.architecture)
    quantize = rounder(rounding, gptq_damp, weight_group)
    out = output_projection_tensors(
        config,
        w,
        calib,
        quantize,
        statistic,
        lm_head_alpha,
        rounding == "gptq" and gptq_lm_head,
        weight_group,
        smoothed_weights,
    )
    if on_quantized is not None:
        on_quantized("output")
    key_scales: dict[int, torch.Tensor] = {}  # KV-producing layer -> its key scale
    for i in range(config.num_layers):
        p = f"layers.{i}."
        fused = {k: v.clone() for k, v in fused_float_weights(config, w, i).items()}
        norms = {n: w[p + n].clone() for n in arch.LAYER_NORMS}
        scales = (
            {}
            if calib is None
            else layer_smoothing_scales(
                config, calib, i, fused, smooth, statistic, alpha, alpha_by_projection, alphas_chosen
            )
        )
        apply_smoothing(config, fused, norms, scales)
        if arch.KEY_SMOOTHING == "qk_rows" and calib is not None and kv_beta > 0:
            apply_key_row_scale(config, w, calib, i, fused, kv_beta)
        for name, weight in fused.items():
            rows = None
            if rounding == "gptq" and gptq_layers and p + name in calib.inputs:  # the rows it sees once smoothed
                rows = calib.inputs[p + name] / scales[name] if name in scales else calib.inputs[p + name]
            out[p + name + ".w_q"], out[p + name + ".w_scale"] = quantize(weight, rows)
            if smoothed_weights is not None:
                smoothed_weights[p + name] = weight
        out.update({p + n: t for n, t in norms.items()})
        if arch.KEY_SMOOTHING == "qk_norm":
            out.update(key_norm_tensors(config, w, calib, i, kv_beta, key_scales))
        if on_quantized is not None:
            on_quantized(p)
    return {k: v.contiguous() for k, v in out.items()}
