"""The shipped Gemma 3 int8 model with its two-term Linears as one C call each (salon.kernels.linear_two_terms: the
norm before, the GEMM of both terms, the post-norm and the residual) against the same model with each of
those parts its own kernel call: the hidden states and logits of a prefill and of decode steps alone and
batched are the same bits, so the fusion changes no served token and no cache hit."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from salon.engine.model import load_model
from salon.engine.model.attention import DenseAttention
from salon.kernels.backend import select_ops
from salon.kernels.cpu.linear_two_terms import composed, library

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


def test_fused_two_term_linears_give_the_composed_bits(int8_model):
    fused, _ = int8_model
    ops = select_ops("cpu")
    assert fused.kernel_ops.linear_two_terms is ops.linear_two_terms
    separate, _ = load_model(
        "gemma-3-270m", "int8", kernel_ops=dataclasses.replace(ops, linear_two_terms=composed), progress=False
    )
    prompts = [list(range(1000, 1070)), [2, 818, 5279, 529, 7001], list(range(5000, 5013))]  # 70 rows: composed
    got, want = _run(fused, prompts, steps=3), _run(separate, prompts, steps=3)
    assert len(got) == len(want) == 6
    for a, b in zip(got, want):
        assert torch.equal(a, b)
