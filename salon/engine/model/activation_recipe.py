"""The activation recipe an int8 model serves with, decided once its architecture is known."""

from __future__ import annotations

import dataclasses

from salon.kernels.backend import Ops

# architecture -> {the kernel family's pick: the recipe its int8 Linears serve instead when none is named}; the
# other architectures, and the other picks, serve the family's pick.
ARCHITECTURE_ACTIVATIONS = {"gemma3": {"two_terms": "group32"}}


def serving_activations(architecture: str, kernel_ops: Ops) -> Ops:
    """`kernel_ops` with the activation recipe a model of `architecture` serves: a recipe the caller named
    (select_ops(activations=...)) as it is; else ARCHITECTURE_ACTIVATIONS' in place of the family's pick (every
    family has group32 kernels: C on the CPU, Triton on a GPU, the PyTorch reference), else the family's own pick
    (select_ops' `auto`).

    gemma3 -> group32 (one int8 term per token and 32 channels in the decoder layers' Linears, the output projection
    rescored: models/gemma3.py INT8_GROUP32_RECIPE and INT8_GROUP32_RESCORED), half the int8 products of two terms,
    because Gemma 3 270M meets the int8 quality gates with it (tests/model/int8_gates.py): teacher-forced top-1 223 of
    229 through EngineCore against the exact tokens (gate 223) and 224 of 229 against float32, perplexity +0.157% of
    the float64 reference (gate +0.3%). llama keeps the family's pick: SmolLM2-135M's group32 recipe scores 256 of 263
    (gate: its float32 path's 263 minus 3), where two terms score 260. Figures: bench.quant_eval, docs/models.md.
    Where the family picks int16 (the AVX2 build without VNNI) Gemma keeps it: there group32 measured slower (Gemma
    3 270M, 2 threads, 3 alternated rounds, group32 / int16 tokens/s: prefill 512 0.97x (0.83-0.98), decode batch 1
    0.86x (0.83-1.15), batch 8 0.73x (0.71-0.78))."""
    recipe = ARCHITECTURE_ACTIVATIONS.get(architecture, {}).get(kernel_ops.activations)
    if kernel_ops.activations_named or recipe is None:
        return kernel_ops
    return dataclasses.replace(kernel_ops, activations=recipe)
