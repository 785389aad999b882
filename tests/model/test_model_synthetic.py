"""synthetic-tiny (sliding W=32, global, and two KV-sharing layers) against a plain float64 reference."""

import math

import pytest
import torch

from salon.engine.model import DenseAttention, load_model, synthetic_config
from salon.engine.model.builder import build_float_model
from salon.engine.model.synthetic import synthetic_weights
from salon.kernels.backend import select_ops


def _reference_forward(cfg, w, ids):
    """The same math written out token by token in float64, straight from the weight dict."""
    w = {k: v.double() for k, v in w.items()}
    T, d, hq, hkv, hd = len(ids), cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def norm(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps) * weight

    def rope(x, base):
        half = hd // 2
        out = x.clone()
        for t in range(T):
            for i in range(half):
                ang = t * base ** (-2 * i / hd)
                c, s = math.cos(ang), math.sin(ang)
                out[t, :, i] = x[t, :, i] * c - x[t, :, i + half] * s
                out[t, :, i + half] = x[t, :, i + half] * c + x[t, :, i] * s
        return out

    x = w["embed"][torch.tensor(ids)] * math.sqrt(d)
    kv = {}
    for li, spec in enumerate(cfg.layers):
        p = f"layers.{li}."
        h = norm(x, w[p + "attn_norm"])
        q = rope(norm((h @ w[p + "attn_q"].T).view(T, hq, hd), w[p + "attn_q_norm"]), spec.rope_base)
        if spec.kv_source_layer is None:
            k = rope(norm((h @ w[p + "attn_k"].T).view(T, hkv, hd), w[p + "attn_k_norm"]), spec.rope_base)
            kv[li] = (k, (h @ w[p + "attn_v"].T).view(T, hkv, hd))
        k, v = kv[li if spec.kv_source_layer is None else spec.kv_source_layer]
        o = torch.zeros(T, hq, hd, dtype=torch.float64)
        for t in range(T):
            for head in range(hq):
                g = head // (hq // hkv)
                keys = [
                    j for j in range(t + 1) if spec.sliding_window_tokens is None or t - j < spec.sliding_window_tokens
                ]
                scores = torch.stack([q[t, head] @ k[j, g] * cfg.attn_scale for j in keys])
                probs = torch.softmax(scores, 0)
                o[t, head] = sum(pr * v[j, g] for pr, j in zip(probs, keys))
        x = x + norm(o.reshape(T, hq * hd) @ w[p + "attn_output"].T, w[p + "post_attention_norm"])
        h = norm(x, w[p + "ffn_norm"])
        gate, up = h @ w[p + "ffn_gate"].T, h @ w[p + "ffn_up"].T
        act = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
        x = x + norm((act * up) @ w[p + "ffn_down"].T, w[p + "post_ffw_norm"])
    return norm(x, w["final_norm"])


@pytest.fixture(scope="module")
def tiny():
    cfg = synthetic_config("synthetic-tiny")
    w = synthetic_weights(cfg)
    return cfg, w, build_float_model(cfg, w, select_ops("cpu"))


def test_config_shape(tiny):
    cfg, _, _ = tiny
    assert [s.attention for s in cfg.layers] == ["sliding", "global", "sliding", "global"]
    assert [s.kv_source_layer for s in cfg.layers] == [None, None, 0, 1]
    assert cfg.kv_layers() == [0, 1]


def test_matches_plain_reference_across_the_window(tiny):
    cfg, w, model = tiny
    ids = [2] + [(37 * i + 11) % 5000 + 300 for i in range(69)]  # 70 tokens > 2 windows of 32
    attn = DenseAttention(cfg)
    hidden = model.forward(torch.tensor(ids), attn.begin_step([len(ids)]), attn)
    ref = _reference_forward(cfg, w, ids)
    torch.testing.assert_close(hidden.double(), ref, atol=2e-4, rtol=2e-4)


def test_incremental_decode_equals_full_forward(tiny):
    cfg, _, model = tiny
    ids = torch.tensor([2] + list(range(1000, 1049)))
    full_attn = DenseAttention(cfg)
    full = model.forward(ids, full_attn.begin_step([50]), full_attn)
    attn = DenseAttention(cfg)
    parts = [model.forward(ids[:20], attn.begin_step([20]), attn)]
    for t in range(20, 50):
        parts.append(model.forward(ids[t : t + 1], attn.begin_step([1]), attn))
    torch.testing.assert_close(torch.cat(parts), full, atol=1e-5, rtol=1e-5)


def test_kv_sharing_halves_kv_bytes():
    share, noshare = synthetic_config("synthetic-tiny"), synthetic_config("synthetic-tiny-noshare")
    per_layer_int8 = 2 * share.num_kv_heads * (share.head_dim + 4)
    assert noshare.kv_bytes_per_token() == 4 * per_layer_int8
    assert share.kv_bytes_per_token() == 2 * per_layer_int8


def test_int8_synthetic_runs_and_tracks_float():
    model, tok = load_model("synthetic-tiny", precision="int8", progress=False)
    ref, _ = load_model("synthetic-tiny", precision="float32", progress=False)
    ids = torch.tensor(tok.encode("User: Hi!\nCharacter: Hello there, how are you today?", True, True))
    outs = []
    for m in (model, ref):
        attn = DenseAttention(m.config, kv_int8=m is model)
        outs.append(m.forward(ids, attn.begin_step([len(ids)]), attn))
    cos = torch.nn.functional.cosine_similarity(outs[0], outs[1], dim=-1)
    assert cos.min() > 0.98
