"""The one interface the engine uses for numeric ops: `select_ops(device) -> Ops`.

CUDA -> the Triton kernels. Anything else -> the CPU fast path in salon/kernels/cpu/ where one exists
(CPU_FAST_PATH_MODULES), else the plain PyTorch reference. All implementations share the signatures of the `_ref`
functions.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from salon.kernels.decoder_block import no_decoder_block, no_decoder_blocks
from salon.kernels.glu import geglu_ref, swiglu_ref
from salon.kernels.kv_write import kv_write_ref
from salon.kernels.linear_rescored import compose_one_read as compose_linear_rescored_one_read
from salon.kernels.linear_rescored import linear_rescored_ref
from salon.kernels.linear_two_terms import compose as compose_linear_two_terms
from salon.kernels.linear_two_terms import compose_summed as compose_linear_two_terms_summed
from salon.kernels.linear_two_terms import linear_group32_ref, linear_int16_ref, linear_two_terms_ref
from salon.kernels.paged_attention import paged_attention_ref
from salon.kernels.quantize import quantize_per_token_ref, quantize_two_terms_ref, rmsnorm_quant_ref
from salon.kernels.rmsnorm import rmsnorm_ref
from salon.kernels.rmsnorm_rope import compose as compose_rmsnorm_rope
from salon.kernels.rmsnorm_rope import rmsnorm_rope_ref
from salon.kernels.rmsnorm_rope_kv import rmsnorm_rope_kv_ref
from salon.kernels.rope import rope_neox_ref
from salon.kernels.w8a8_gemm import w8a8_gemm_ref

OP_NAMES = (
    "quantize_per_token",
    "quantize_two_terms",
    "rmsnorm",
    "rmsnorm_quant",
    "w8a8_gemm",
    "rope_neox",
    "kv_write",
    "paged_attention",
    "linear_two_terms",
    "rmsnorm_rope",
    "rmsnorm_rope_kv",
    "geglu",
    "swiglu",
    "decoder_block",
    "linear_int16",
    "decoder_blocks",
    "linear_group32",
    "linear_rescored",
)
# The activation recipes of an int8 Linear (salon/engine/model/linear.py) that every family has kernels for: two int8
# terms (salon.kernels.quantize), or one int16 term (salon.kernels.w16a8_grouped).
ACTIVATION_RECIPES = ("two_terms", "int16")
# Recipes no family picks on its own: one int8 term per token and 32 channels (salon.kernels.w8a8_group32), with a C
# op in the CPU family (salon.kernels.cpu.linear_two_terms) and Triton kernels in the Triton family
# (salon.kernels.w8a8_group32_triton). A model's architecture may pick it for `auto` once the model is known
# (salon.engine.model.activation_recipe).
REFERENCE_ACTIVATION_RECIPES = ("group32",)


def other_activations(recipe: str) -> str:
    """The activation recipe that is not `recipe` (a same-run baseline's)."""
    return next(r for r in ACTIVATION_RECIPES if r != recipe)


@dataclass(frozen=True)
class Ops:
    quantize_per_token: Callable
    quantize_two_terms: Callable
    rmsnorm: Callable
    rmsnorm_quant: Callable
    w8a8_gemm: Callable
    rope_neox: Callable
    kv_write: Callable
    paged_attention: Callable
    linear_two_terms: Callable  # salon.kernels.linear_two_terms: norm, two-term GEMM, post-norm, residual as one op
    rmsnorm_rope: Callable  # salon.kernels.rmsnorm_rope: the per-head norm, then RoPE
    # salon.kernels.rmsnorm_rope_kv: q's and k's per-head norm and RoPE, and the KV write of k and v, as one op
    rmsnorm_rope_kv: Callable
    geglu: Callable  # salon.kernels.glu: gelu_tanh(gate) * up with the fixed-order contract (int8 GeGLU Linears)
    swiglu: Callable  # salon.kernels.glu: silu(gate) * up with the fixed-order contract (int8 SwiGLU Linears)
    # salon.kernels.decoder_block: a whole decoder layer (Gemma 3, Llama) over the paged int8 KV cache, or None (the
    # model composes)
    decoder_block: Callable
    # salon.kernels.linear_two_terms's int16 op: norm, one int16 activation term, grouped GEMM, post-norm, residual
    linear_int16: Callable
    # salon.kernels.decoder_block: a step's decoder layers in one call, as many as the family takes (the model composes
    # the rest)
    decoder_blocks: Callable
    # salon.kernels.linear_two_terms's group32 op: norm, one int8 term per token and 32 channels, GEMM, post-norm,
    # residual
    linear_group32: Callable
    # salon.kernels.linear_rescored: the group32 recipe's output projection, group32 with the rows that could be the
    # largest under two terms rescored with them
    linear_rescored: Callable
    name: str  # "triton", "cpu" or "ref": which family serves the ops (a cpu family falls back per op to ref)
    # Which of the family's builds runs, where they give different bits ("": one build): the CPU family's paged
    # attention has one per ISA and a PyTorch path (salon.kernels.cpu.paged_attention.build)
    build: str = ""
    # The activation recipe the family's int8 Linears run (ACTIVATION_RECIPES): the faster one of its kernels
    # where it has a choice; the same on every family unless a CPU's kernels favour the other.
    activations: str = "two_terms"
    # Whether the caller named `activations` (select_ops(activations=...)); False: the family's pick, which the
    # model's architecture may replace once the model is known (salon.engine.model.activation_recipe)
    activations_named: bool = False


def reference_ops() -> Ops:
    return Ops(
        quantize_per_token=quantize_per_token_ref,
        quantize_two_terms=quantize_two_terms_ref,
        rmsnorm=rmsnorm_ref,
        rmsnorm_quant=rmsnorm_quant_ref,
        w8a8_gemm=w8a8_gemm_ref,
        rope_neox=rope_neox_ref,
        kv_write=kv_write_ref,
        paged_attention=paged_attention_ref,
        linear_two_terms=linear_two_terms_ref,
        rmsnorm_rope=rmsnorm_rope_ref,
        rmsnorm_rope_kv=rmsnorm_rope_kv_ref,
        geglu=geglu_ref,
        swiglu=swiglu_ref,
        decoder_block=no_decoder_block,
        linear_int16=linear_int16_ref,
        decoder_blocks=no_decoder_blocks,
        linear_group32=linear_group32_ref,
        linear_rescored=linear_rescored_ref,
        name="ref",
    )


def triton_ops() -> Ops:
    from salon.kernels.decoder_block import decoder_block_triton, decoder_blocks_triton
    from salon.kernels.glu import geglu_triton, swiglu_triton
    from salon.kernels.kv_write import kv_write_triton
    from salon.kernels.paged_attention import paged_attention_triton
    from salon.kernels.quantize import (
        quantize_per_token_triton,
        quantize_two_terms_triton,
        rmsnorm_quant_triton,
        rmsnorm_quant_two_terms_triton,
    )
    from salon.kernels.rmsnorm import rmsnorm_residual_triton, rmsnorm_triton
    from salon.kernels.rmsnorm_rope_kv import rmsnorm_rope_kv_triton
    from salon.kernels.rope import rope_neox_triton
    from salon.kernels.w8a8_gemm import w8a8_gemm_triton
    from salon.kernels.w8a8_group32_triton import (
        quantize_group32_triton,
        rmsnorm_quant_group32_triton,
        w8a8_group32_triton,
        w8a8_group32_two_terms_triton,
    )
    from salon.kernels.w8a8_two_terms import w8a8_two_terms_triton
    from salon.kernels.w16a8_grouped import quantize_int16_ref, w16a8_grouped_ref

    # the norm and both terms in one launch, the terms summed in the GEMM's epilogue: the bits of
    # compose_linear_two_terms(rmsnorm_triton, quantize_two_terms_triton, w8a8_gemm_triton); the post-norm and the
    # residual add one launch
    linear_two_terms = compose_linear_two_terms_summed(
        rmsnorm_triton,
        rmsnorm_quant_two_terms_triton,
        quantize_two_terms_triton,
        w8a8_two_terms_triton,
        rmsnorm_residual_triton,
        "linear_two_terms_triton",
    )
    # the norm and the quantization in one launch, the residual in the GEMM's epilogue (salon.kernels.
    # w8a8_group32_triton): the bits of compose_linear_two_terms(rmsnorm_triton, quantize_group32_triton,
    # w8a8_group32_triton, terms=1); the post-norm and the residual add one launch
    linear_group32 = compose_linear_two_terms_summed(
        rmsnorm_triton,
        rmsnorm_quant_group32_triton,
        quantize_group32_triton,
        w8a8_group32_triton,
        rmsnorm_residual_triton,
        "linear_group32_triton",
    )
    return Ops(
        quantize_per_token=quantize_per_token_triton,
        quantize_two_terms=quantize_two_terms_triton,
        rmsnorm=rmsnorm_triton,
        rmsnorm_quant=rmsnorm_quant_triton,
        w8a8_gemm=w8a8_gemm_triton,
        rope_neox=rope_neox_triton,
        kv_write=kv_write_triton,
        paged_attention=paged_attention_triton,
        linear_two_terms=linear_two_terms,
        rmsnorm_rope=compose_rmsnorm_rope(rmsnorm_triton, rope_neox_triton, "rmsnorm_rope_triton"),
        # one launch for q, k and the KV write, with the bits of rmsnorm_rope_triton's two ops on q and on k,
        # then kv_write_triton
        rmsnorm_rope_kv=rmsnorm_rope_kv_triton,
        geglu=geglu_triton,
        swiglu=swiglu_triton,
        decoder_block=decoder_block_triton,
        decoder_blocks=decoder_blocks_triton,
        # the int16 recipe is the CPU's (no Triton kernel of its own yet): its GEMM is the PyTorch reference
        linear_int16=compose_linear_two_terms(
            rmsnorm_triton, quantize_int16_ref, w16a8_grouped_ref, "linear_int16_triton", terms=1
        ),
        linear_group32=linear_group32,
        # both projections of every row from one read of the weights, then the selection (no data-dependent
        # shapes: a CUDA graph captures it)
        linear_rescored=compose_linear_rescored_one_read(
            quantize_group32_triton, quantize_two_terms_triton, w8a8_group32_two_terms_triton, "linear_rescored_triton"
        ),
        name="triton",
    )


# op -> module under salon/kernels/cpu/ that defines `<op>_cpu`.
CPU_FAST_PATH_MODULES = {
    "w8a8_gemm": "salon.kernels.cpu.w8a8_gemm",
    "paged_attention": "salon.kernels.cpu.paged_attention",
    "quantize_per_token": "salon.kernels.cpu.quantize",
    "quantize_two_terms": "salon.kernels.cpu.quantize",
    "rmsnorm": "salon.kernels.cpu.rmsnorm",
    "rmsnorm_quant": "salon.kernels.cpu.quantize",
    "kv_write": "salon.kernels.cpu.kv_write",
    "rope_neox": "salon.kernels.cpu.rope",
    "linear_two_terms": "salon.kernels.cpu.linear_two_terms",
    "rmsnorm_rope": "salon.kernels.cpu.rmsnorm_rope",
    "rmsnorm_rope_kv": "salon.kernels.cpu.rmsnorm_rope",
    "geglu": "salon.kernels.cpu.glu",
    "swiglu": "salon.kernels.cpu.glu",
    "decoder_block": "salon.kernels.cpu.decoder_block",
    "linear_int16": "salon.kernels.cpu.linear_two_terms",
    "decoder_blocks": "salon.kernels.cpu.decoder_block",
    "linear_group32": "salon.kernels.cpu.linear_two_terms",
    "linear_rescored": "salon.kernels.cpu.linear_two_terms",
}


def _cpu_fast_path(op: str) -> Callable | None:
    """`<op>_cpu` from its salon/kernels/cpu/ module if that module exists, imported on first use."""
    module_name = CPU_FAST_PATH_MODULES.get(op)
    if module_name is None:
        return None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name not in (module_name, "salon.kernels.cpu"):
            raise  # the module exists but one of its own imports is missing: a real error
        return None
    return getattr(module, f"{op}_cpu", None)


def cpu_activations() -> str:
    """The CPU family's activation recipe here: one int16 term where the grouped GEMM is AVX2's (no VNNI: there
    vpmaddwd makes int16 products faster than the two int8 terms' vpmaddubsw, measured by
    `python -m bench.gemv --int16`) and the int16 kernel
    builds; two int8 terms elsewhere (VNNI's vpdpbusd, or the references)."""
    from salon.kernels.cpu.w8a8_grouped import chosen_isa
    from salon.kernels.cpu.w16a8_grouped import library as int16_library

    return "int16" if chosen_isa() == "avx2" and int16_library() is not None else "two_terms"


def cpu_ops() -> Ops:
    from salon.kernels.cpu.paged_attention import build

    ref = reference_ops()
    chosen = {op: _cpu_fast_path(op) or getattr(ref, op) for op in OP_NAMES}
    return Ops(**chosen, name="cpu", build=build(), activations=cpu_activations())


KERNEL_FAMILIES = ("auto", "triton", "cpu", "ref")


def select_ops(device: torch.device | str, family: str = "auto", activations: str = "auto") -> Ops:
    """The op family for tensors on `device`: "auto" is Triton on CUDA and the CPU fast path elsewhere.
    "triton" on a CPU device runs the same kernels through Triton's interpreter (slow; how the GPU path is
    tested end to end without a GPU); "ref" is the plain PyTorch reference. `activations` sets the int8
    Linears' activation recipe (ACTIVATION_RECIPES or REFERENCE_ACTIVATION_RECIPES; "auto": the family's own
    choice, until a model's architecture picks its own: salon.engine.model.activation_recipe)."""
    recipes = ACTIVATION_RECIPES + REFERENCE_ACTIVATION_RECIPES
    if activations != "auto" and activations not in recipes:
        raise ValueError(f"activations: must be auto or one of {', '.join(recipes)}, got {activations!r}")
    ops = _select_family(torch.device(device), family)
    return ops if activations == "auto" else dataclasses.replace(ops, activations=activations, activations_named=True)


def _select_family(device: torch.device, family: str) -> Ops:
    if family not in KERNEL_FAMILIES:
        raise ValueError(f"kernels: must be one of {', '.join(KERNEL_FAMILIES)}, got {family!r}")
    if family == "auto":
        family = "triton" if device.type == "cuda" else "cpu"
    if family == "cpu" and device.type == "cuda":
        raise ValueError("kernels: the cpu family runs on CPU tensors only (use triton or ref on cuda)")
    return {"triton": triton_ops, "cpu": cpu_ops, "ref": reference_ops}[family]()
