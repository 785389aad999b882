"""group32 activations (one int8 term per token and 32 channels, salon.kernels.w8a8_group32) in the model: the
checkpoint they run on (the shipped one, whose weights carry a scale per row and 32 input channels for every
architecture), the Linears that take them (the architecture's INT8_GROUP32_RECIPE: the decoder layers' projections,
the output projection keeping two terms), a small llama model whose group32 Linears equal a plain
dequantize-and-matmul within the contract's float32 rounding, and the CPU family's C op of the recipe
(salon.kernels.cpu.linear_two_terms.linear_group32_cpu) giving that model the bits of the reference op through
prefills above and below the one call's MAX_ROWS and batched decode steps (the shipped Gemma's:
tests/model/test_model_fused_linear.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from salon.engine.model import DenseAttention, load
from salon.engine.model.checkpoint import CHECKPOINT_FILE, checkpoint_format, ensure_checkpoint
from salon.engine.model.linear import Int8Linear, dequantize_weight
from salon.engine.model.loader import open_model_file
from salon.engine.model.models import gemma3, llama
from salon.kernels.backend import select_ops
from salon.kernels.cpu.linear_two_terms import MAX_ROWS, linear_group32_cpu
from salon.kernels.linear_two_terms import linear_group32_ref
from salon.kernels.rmsnorm import rmsnorm_ref
from salon.kernels.w8a8_group32 import quantize_group32_ref
from tests.model.gguf_files import write_gemma3_gguf, write_llama_gguf

GROUP32_OPS = select_ops("cpu", activations="group32")


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("llama") / "model.gguf"
    write_llama_gguf(path, num_layers=2, d_model=128, ffn=192, seed=7, tied=True)
    return path


def _format_of(path: Path) -> str:
    with safe_open(str(path), "pt") as f:
        return f.metadata()["format"]


def test_llama_checkpoint_has_weights_per_row_and_32_channels_and_replaces_the_per_row_one(llama_gguf, tmp_path):
    cache = tmp_path / "cache"
    mf = open_model_file(str(llama_gguf), cache)
    assert checkpoint_format(mf.config) == llama.INT8_CHECKPOINT_FORMAT == "salon-int8-v9"

    path, converted = ensure_checkpoint(mf, cache, progress=False)
    assert converted and path.name == CHECKPOINT_FILE and _format_of(path) == "salon-int8-v9"
    tensors = load_file(str(path))
    assert tensors["layers.0.qkv.w_scale"].shape == (tensors["layers.0.qkv.w_q"].shape[0], 128 // 32)
    assert tensors["layers.1.down.w_scale"].shape == (128, 192 // 32)
    assert tensors["embed.w_scale"].shape == (tensors["embed.w_q"].shape[0], 128 // 32)
    assert ensure_checkpoint(mf, cache, progress=False) == (path, False)

    # a cache of the per-row recipe (format v8) is converted again, never misread
    save_file(tensors, str(path), metadata={"format": "salon-int8-v8", "sha256": mf.source.sha256})
    again, converted = ensure_checkpoint(mf, cache, progress=False)
    assert (again, converted) == (path, True) and _format_of(path) == "salon-int8-v9"


def test_gemma_keeps_its_checkpoint_format(tmp_path):
    path = tmp_path / "gemma.gguf"
    write_gemma3_gguf(path, num_layers=2, d_model=64, ffn=96, seed=1)
    config = open_model_file(str(path), tmp_path / "cache").config
    assert checkpoint_format(config) == gemma3.INT8_CHECKPOINT_FORMAT == "salon-int8-v8"
    assert gemma3.INT8_GROUP32_RECIPE == llama.INT8_GROUP32_RECIPE == ("qkv", "o", "gate_up", "down")


@pytest.fixture(scope="module")
def group32_model(llama_gguf, tmp_path_factory):
    return load(str(llama_gguf), "int8", tmp_path_factory.mktemp("cache"), GROUP32_OPS, progress=False).model


def _linears(model) -> list[Int8Linear]:
    return [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]


def test_the_layers_take_group32_and_its_fused_decoder_layer_the_output_projection_two_terms(group32_model):
    assert group32_model.numerics == "int8-a8g32:down,gate_up,o,qkv;rescored:lm_head"
    assert all(lin.group32_activations and lin.w_scale.dim() == 2 for lin in _linears(group32_model))
    lm_head = group32_model.lm_head
    assert not lm_head.group32_activations and lm_head.activation_terms == 2 and lm_head.w_scale.dim() == 2
    assert all(layer.block is not None and layer.block.group32_activations for layer in group32_model.layers)


def _dequantized_linear(x, w_q, w_scale, norm_weight=None, eps=0.0, post_norm=None, residual=None):
    """The recipe as a plain float64 matmul of the dequantized activations and weights."""
    h = x if norm_weight is None else rmsnorm_ref(x, norm_weight, eps)
    q, s = quantize_group32_ref(h)
    a = (q.reshape(q.shape[0], -1, 32).double() * s.double()[:, :, None]).reshape(q.shape)
    out = (a @ dequantize_weight(w_q, w_scale).double().T).to(torch.float32)
    if post_norm is not None:
        out = rmsnorm_ref(out, post_norm, eps)
    return out if residual is None else residual + out


def test_each_linear_equals_dequantize_and_matmul_within_the_float32_rounding(group32_model):
    g = torch.Generator().manual_seed(3)
    for lin in _linears(group32_model):
        k = lin.w_q.shape[1]
        x = torch.randn(6, k, generator=g) * torch.rand(6, 1, generator=g) * 4
        x[2, 5] = 60.0  # an outlier: only its own group's scale grows
        x[4, :32] = 0.0  # a group of zeros
        assert lin.linear_group32 is GROUP32_OPS.linear_group32
        raw = lin.linear_group32(x, lin.w_q, lin.w_scale)  # the Linear's op, before any gate
        q, s = quantize_group32_ref(x)
        a = (q.reshape(6, -1, 32).double() * s.double()[:, :, None]).reshape(6, k)
        w = dequantize_weight(lin.w_q, lin.w_scale).double()
        exact = a @ w.T
        # G products and G - 1 sums, each rounded once (and each scale product): (G + 2) units of 2**-24 of the
        # summed magnitudes
        bound = (k // 32 + 2) * 2.0**-24 * (a.abs() @ w.abs().T)
        assert ((raw.double() - exact).abs() <= bound).all(), lin.w_q.shape


def test_the_model_equals_its_dequantized_twin_and_answers_each_row_alone(group32_model, llama_gguf, tmp_path):
    twin_ops = dataclasses.replace(GROUP32_OPS, linear_group32=_dequantized_linear)
    twin = load(str(llama_gguf), "int8", tmp_path / "cache", twin_ops, progress=False).model
    ids = torch.tensor([5, 17, 3, 40, 22, 9, 31, 12])

    def logits(model, tokens):
        attn = DenseAttention(model.config)
        return model.logits(model.forward(tokens, attn.begin_step([len(tokens)]), attn))

    got, want = logits(group32_model, ids), logits(twin, ids)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * want.abs().max().item())
    # a prompt's last row is the same bits whether its earlier rows ran with it or not (batch invariance of the op)
    lin = group32_model.layers[0].qkv
    x = torch.randn(5, lin.w_q.shape[1])
    assert torch.equal(lin(x)[3:4], lin(x[3:4]))


def _prefills_and_decodes(model, prompts: list[list[int]], steps: int) -> list[torch.Tensor]:
    """Each prompt prefilled alone (int8 KV), then `steps` greedy decode steps of all of them together: the logits."""
    attn = DenseAttention(model.config, num_seqs=len(prompts), kv_int8=True)
    out = []
    for s, ids in enumerate(prompts):
        lens = [0] * len(prompts)
        lens[s] = len(ids)
        out.append(model.logits(model.forward(torch.tensor(ids), attn.begin_step(lens), attn)[-1:]))
    tokens = [int(o.argmax()) for o in out]
    for _ in range(steps):
        logits = model.logits(model.forward(torch.tensor(tokens), attn.begin_step([1] * len(prompts)), attn))
        out.append(logits)
        tokens = logits.argmax(dim=-1).tolist()
    return out


def _reference_twin(ops):
    return dataclasses.replace(ops, linear_group32=linear_group32_ref)


def test_the_cpu_familys_c_op_gives_the_reference_ops_bits_in_the_llama_model(group32_model, llama_gguf, tmp_path):
    assert group32_model.layers[0].qkv.linear_group32 is linear_group32_cpu
    twin = load(str(llama_gguf), "int8", tmp_path / "cache", _reference_twin(GROUP32_OPS), progress=False).model
    prompts = [list(range(3, 3 + MAX_ROWS + 6)), [5, 17, 3, 40, 22], list(range(50, 63))]
    got, want = _prefills_and_decodes(group32_model, prompts, 3), _prefills_and_decodes(twin, prompts, 3)
    assert len(got) == len(want) == 6
    assert all(torch.equal(a, b) for a, b in zip(got, want))
