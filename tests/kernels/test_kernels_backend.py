"""select_ops picks one implementation family per device; every family agrees with the references."""

from __future__ import annotations

import dataclasses

import torch
from kernels_cases import make_paged_case

from salon.kernels import backend
from salon.kernels.backend import OP_NAMES, Ops, select_ops
from salon.kernels.paged_attention import paged_attention_ref
from salon.kernels.w8a8_gemm import w8a8_gemm_ref


def test_ops_is_frozen_and_names_every_contract_op():
    ops = select_ops("cpu")
    fields = {f.name for f in dataclasses.fields(Ops)}
    assert fields == set(OP_NAMES) | {"name", "build", "activations", "activations_named"}
    assert all(callable(getattr(ops, op)) for op in OP_NAMES)
    try:
        ops.w8a8_gemm = None  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("Ops must be frozen")


def test_cpu_selects_fast_paths_where_present_else_references():
    ops = select_ops(torch.device("cpu"))
    assert ops.name == "cpu"
    ref = backend.reference_ops()
    for op in OP_NAMES:
        fast = backend._cpu_fast_path(op)
        assert getattr(ops, op) is (fast or getattr(ref, op)), op


def test_cuda_selects_triton_launchers():
    ops = select_ops("cuda")  # selection only; nothing runs
    assert ops.name == "triton"
    assert all(getattr(ops, op).__name__ == f"{op}_triton" for op in OP_NAMES)


def test_selected_cpu_ops_agree_with_references():
    ops = select_ops("cpu")
    g = torch.Generator().manual_seed(11)
    a = torch.randint(-127, 128, (5, 300), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (24, 300), generator=g, dtype=torch.int8)
    a_s, w_s = torch.rand(5, generator=g) / 50, torch.rand(24, generator=g) / 50
    res = torch.randn(5, 12, generator=g)
    torch.testing.assert_close(
        ops.w8a8_gemm(a, a_s, w, w_s, residual=res, geglu=True),
        w8a8_gemm_ref(a, a_s, w, w_s, residual=res, geglu=True),
        rtol=1e-5,
        atol=1e-5,
    )
    case = make_paged_case(
        [23, 9, 6], [1, 3, 6], num_q_heads=4, num_kv_heads=1, head_dim=16, block_size=4, sliding_window=6, seed=2
    )
    torch.testing.assert_close(ops.paged_attention(case.args()), paged_attention_ref(case.args()), rtol=1e-5, atol=1e-5)
    for dtype in (torch.float32, torch.bfloat16):  # float caches: the PyTorch path (the C kernel reads int8)
        fcase = case.as_float(dtype)
        torch.testing.assert_close(
            ops.paged_attention(fcase.args()), paged_attention_ref(fcase.args()), rtol=1e-5, atol=1e-5
        )


def test_the_activation_recipe_is_the_cpu_kernels_choice_unless_set():
    from salon.kernels.cpu.w8a8_grouped import chosen_isa
    from salon.kernels.cpu.w16a8_grouped import library as int16_library

    ops = select_ops("cpu")
    assert ops.activations == ("int16" if chosen_isa() == "avx2" and int16_library() is not None else "two_terms")
    assert select_ops("cpu", "ref").activations == "two_terms" and select_ops("cuda").activations == "two_terms"
    assert not ops.activations_named  # the family's pick: a model's architecture may replace it
    for recipe in backend.ACTIVATION_RECIPES + backend.REFERENCE_ACTIVATION_RECIPES:
        named = select_ops("cpu", activations=recipe)
        assert named.activations == recipe and named.activations_named
    try:
        select_ops("cpu", activations="int4")
    except ValueError as e:
        assert "activations" in str(e)
    else:
        raise AssertionError("an unknown recipe must be refused")
