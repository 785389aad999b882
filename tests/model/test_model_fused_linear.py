"""The Gemma 3 int8 model with two-term Linears as one C call each (salon.kernels.linear_two_terms: the
norm before, the GEMM of both terms, the post-norm and the residual) against the same model with each of
those parts its own kernel call: the hidden states and logits of a prefill and of decode steps alone and
batched are the same bits, so the fusion changes no served token and no cache hit. The same for the group32
activations (one int8 term per token and 32 channels, the recipe Gemma serves by default): the CPU family's C op
against the reference op."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from salon.engine.model import load_model
from salon.engine.model.attention import DenseAttention
from salon.kernels.backend import select_ops
from salon.kernels.cpu.linear_two_terms import composed, library, linear_group32_cpu
from salon.kernels.linear_two_terms import linear_group32_ref

pytestmark = pytest.mark.skipif(library() is None, reason="the one C call needs x86-64 with AVX2 and cc")


def _run(model, prompts: list[list[int]], steps: int):
    """Each prompt prefilled alone, then `steps` decode steps of all of them together: the logits of each."""
    attn = DenseAttention(model.config, num_seqs=len(prompts), kv_int8=True)
    out = []
    for s, ids in enumerate(prompts):
        lens = [0] * len(prompts)
        lens[s] = len(ids)
        positions = attn.begin_step(lens)
        hidden = model.forward(torch.tensor(ids), positions, attn)
        out.append(model.logits(hidden[-1:]))
    tokens = [int(o.argmax()) for o in out]
    for _ in range(steps):
        positions = attn.begin_step([1] * len(prompts))
        logits = model.logits(model.forward(torch.tensor(tokens), positions, attn))
        out.append(logits)
        tokens = logits.argmax(dim=-1).tolist()
    return out


def test_fused_two_term_linears_give_the_composed_bits():
    """With two int8 terms named (Gemma serves group32 by default: salon.engine.model.activation_recipe)."""
    ops = select_ops("cpu", activations="two_terms")
    fused, _ = load_model("gemma-3-270m", "int8", kernel_ops=ops, progress=False)
    assert fused.numerics == "int8" and fused.layers[0].down.linear_two_terms is ops.linear_two_terms
    separate, _ = load_model(
        "gemma-3-270m", "int8", kernel_ops=dataclasses.replace(ops, linear_two_terms=composed), progress=False
    )
    prompts = [list(range(1000, 1070)), [2, 818, 5279, 529, 7001], list(range(5000, 5013))]  # 70 rows: composed
    got, want = _run(fused, prompts, steps=3), _run(separate, prompts, steps=3)
    assert len(got) == len(want) == 6
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_group32_linears_of_the_cpu_family_give_the_reference_ops_bits():
    """A 70-row prefill (above MAX_ROWS: the composition of the CPU family's C kernels) and a 5-row one (the one C
    call), then a batched decode step: every logit the bits of the model whose Linears run the reference op
    (salon.kernels.linear_two_terms.linear_group32_ref)."""
    ops = select_ops("cpu", activations="group32")
    fast, _ = load_model("gemma-3-270m", "int8", kernel_ops=ops, progress=False)
    assert fast.kernel_ops.activations == "group32"
    ref, _ = load_model(
        "gemma-3-270m", "int8", kernel_ops=dataclasses.replace(ops, linear_group32=linear_group32_ref), progress=False
    )
    linears = [lin for layer in fast.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert all(lin.group32_activations and lin.linear_group32 is linear_group32_cpu for lin in linears)
    prompts = [list(range(1000, 1070)), [2, 818, 5279, 529, 7001]]
    got, want = _run(fast, prompts, steps=1), _run(ref, prompts, steps=1)
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        assert torch.equal(a, b)
