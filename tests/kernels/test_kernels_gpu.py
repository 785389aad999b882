"""The Triton kernels compiled for a real GPU, on model-sized shapes (Gemma 3 270M: d_model 640, ffn 2048,
4 query heads over 1 KV head of 256, sliding window 512, contexts to 32k). Skipped without CUDA."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kernels_cases import make_paged_case

from salon.kernels.glu import geglu_ref, geglu_triton, swiglu_ref, swiglu_triton
from salon.kernels.kv_write import kv_write_ref, kv_write_triton
from salon.kernels.paged_attention import paged_attention_ref, paged_attention_triton
from salon.kernels.quantize import (
    quantize_per_token_ref,
    quantize_per_token_triton,
    quantize_two_terms_ref,
    quantize_two_terms_triton,
    rmsnorm_quant_ref,
    rmsnorm_quant_triton,
)
from salon.kernels.rope import rope_neox_ref, rope_neox_triton
from salon.kernels.w8a8_gemm import w8a8_gemm_ref, w8a8_gemm_triton

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEV = "cuda"


@pytest.mark.parametrize("M", [1, 7, 64, 256, 1000])
@pytest.mark.parametrize("K,N,geglu", [(640, 1024, False), (640, 4096, True), (2048, 640, False), (640, 262144, False)])
def test_gpu_w8a8_gemm_model_shapes(M, K, N, geglu):
    g = torch.Generator(device=DEV).manual_seed(M + N)
    a = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8, device=DEV)
    w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8, device=DEV)
    a_s = torch.rand(M, generator=g, device=DEV) / 50
    w_s = torch.rand(N, generator=g, device=DEV) / 50
    res = torch.randn(M, N // 2 if geglu else N, generator=g, device=DEV)
    out = w8a8_gemm_triton(a, a_s, w, w_s, residual=res, geglu=geglu)
    ref = w8a8_gemm_ref(a, a_s, w, w_s, residual=res, geglu=geglu)
    if geglu:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    else:
        assert torch.equal(out, ref)  # exact int32 accumulation, same dequant order


@pytest.mark.parametrize("M", [1, 7, 64, 256])
@pytest.mark.parametrize("K,N,geglu", [(640, 1024, False), (640, 4096, True), (2048, 640, False)])
def test_gpu_w8a8_grouped_gemm_model_shapes(M, K, N, geglu):
    # w_scale f32[N, K/32]: the group-scaled kernel of salon/kernels/w8a8_grouped.py, compiled without FMA
    g = torch.Generator(device=DEV).manual_seed(M + N + 1)
    a = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8, device=DEV)
    w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8, device=DEV)
    a_s = torch.rand(M, generator=g, device=DEV) / 50
    w_s = torch.rand(N, K // 32, generator=g, device=DEV) / 50
    bias = torch.randn(N, generator=g, device=DEV)
    res = torch.randn(M, N // 2 if geglu else N, generator=g, device=DEV)
    out = w8a8_gemm_triton(a, a_s, w, w_s, bias=bias, residual=res, geglu=geglu)
    ref = w8a8_gemm_ref(a, a_s, w, w_s, bias=bias, residual=res, geglu=geglu)
    if geglu:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    else:
        assert torch.equal(out, ref)  # exact int32 per group, same rounded products and sums in group order
    alone = w8a8_gemm_triton(a[-1:], a_s[-1:], w, w_s, bias=bias, residual=res[-1:], geglu=geglu)
    assert torch.equal(alone, out[-1:])  # batch invariance across the M buckets of the tile configs


def test_gpu_quantize_and_rmsnorm_quant():
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(4096, 2048, generator=g, device=DEV) * 3
    q, s = quantize_per_token_triton(x)
    # the reference on the CPU: on CUDA torch divides by a Python scalar as a product with its reciprocal
    # (absmax / 127.0), which is not the contract's IEEE division
    q_ref, s_ref = quantize_per_token_ref(x.cpu())
    assert torch.equal(q.cpu(), q_ref) and torch.equal(s.cpu(), s_ref)
    w = torch.randn(2048, generator=g, device=DEV) + 1
    q, s = rmsnorm_quant_triton(x, w, 1e-6)
    q_ref, s_ref = rmsnorm_quant_ref(x, w, 1e-6)
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=0)
    assert (q.int() - q_ref.int()).abs().max() <= 1


@pytest.mark.parametrize("M", [1, 7, 256, 2048])
@pytest.mark.parametrize("K", [640, 2048])
def test_gpu_quantize_two_terms(M, K):
    # the reference on the CPU (torch on CUDA divides by a Python scalar through its reciprocal)
    g = torch.Generator(device=DEV).manual_seed(M + K)
    x = torch.randn(M, K, generator=g, device=DEV) * 3
    q, s = quantize_two_terms_triton(x)
    q_ref, s_ref = quantize_two_terms_ref(x.cpu())
    assert torch.equal(q.cpu(), q_ref) and torch.equal(s.cpu(), s_ref)


@pytest.mark.parametrize("glu,ref", [(geglu_triton, geglu_ref), (swiglu_triton, swiglu_ref)])
@pytest.mark.parametrize("M", [1, 7, 256, 2048])
def test_gpu_glu_model_shapes(M, glu, ref):
    # FFN width 2048 (Gemma 3 270M), gates spread over the exp's whole range; the references on the CPU
    g = torch.Generator(device=DEV).manual_seed(M)
    y = torch.randn(M, 2 * 2048, generator=g, device=DEV) * torch.logspace(-4, 2, M, device=DEV)[:, None]
    assert torch.equal(glu(y).cpu(), ref(y.cpu()))
    gates = torch.cat([torch.linspace(-60, 60, 4001), -torch.logspace(-30, 6, 999), torch.logspace(-30, 6, 999)])
    y = torch.cat([gates, torch.randn(gates.numel())])[None, :]
    assert torch.equal(glu(y.to(DEV)).cpu(), ref(y))


def test_gpu_rope_and_kv_write():
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(3000, 4, 256, generator=g, device=DEV)
    pos = torch.randint(0, 32768, (3000,), generator=g, device=DEV)
    torch.testing.assert_close(rope_neox_triton(x, pos, 1e6), rope_neox_ref(x, pos, 1e6), rtol=1e-5, atol=1e-5)
    k, v = x[:, :1].contiguous(), x[:, 1:2].contiguous()
    caches = [torch.zeros(512, 16, 1, 256, dtype=torch.int8, device=DEV) for _ in range(2)]
    scales = [torch.zeros(512, 16, 1, device=DEV) for _ in range(2)]
    expected = [t.cpu() for t in caches + scales]  # the reference on the CPU (its scale is absmax / 127.0)
    slots = torch.randperm(512 * 16, generator=g, device=DEV)[:3000]
    kv_write_triton(k, v, *caches, *scales, slots)
    kv_write_ref(k.cpu(), v.cpu(), *expected, slots.cpu())
    assert all(torch.equal(a.cpu(), b) for a, b in zip(caches + scales, expected))


@pytest.mark.parametrize("window", [None, 512])
def test_gpu_paged_decode_long_contexts(window):
    case = make_paged_case(
        [32768, 4097, 513, 1, 20000],
        [1] * 5,
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=256,
        block_size=16,
        sliding_window=window,
        seed=3,
    ).to(DEV)
    out = paged_attention_triton(case.args())
    torch.testing.assert_close(out, paged_attention_ref(case.args()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [None, 512])
def test_gpu_paged_prefill_mixed_batch(window):
    case = make_paged_case(
        [2000, 1300, 77, 5000],
        [2000, 257, 77, 1],
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=256,
        block_size=16,
        sliding_window=window,
        seed=4,
    ).to(DEV)
    out = paged_attention_triton(case.args())
    torch.testing.assert_close(out, paged_attention_ref(case.args()), rtol=1e-4, atol=1e-4)


def test_gpu_paged_prefill_chunked_is_bit_identical_to_whole():
    case = make_paged_case(
        [1500], [1500], num_q_heads=4, num_kv_heads=1, head_dim=256, block_size=16, sliding_window=512, seed=5
    ).to(DEV)
    whole = paged_attention_triton(case.args())
    parts = []
    for lo, hi in [(0, 700), (700, 1033), (1033, 1034), (1034, 1500)]:  # [1033, 1034) runs as decode
        args = dataclasses.replace(
            case.args(),
            q=case.q[lo:hi],
            query_start_loc=torch.tensor([0, hi - lo], dtype=torch.int32, device=DEV),
            seq_lens=torch.tensor([hi], dtype=torch.int32, device=DEV),
        )
        parts.append(paged_attention_triton(args))
    assert torch.equal(torch.cat(parts), whole)


def test_gpu_paged_decode_batch_invariant():
    case = make_paged_case(
        [9000, 300, 4500],
        [1, 1, 1],
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=256,
        block_size=16,
        sliding_window=None,
        seed=6,
    ).to(DEV)
    batch = paged_attention_triton(case.args())
    args = dataclasses.replace(
        case.args(),
        q=case.q[2:3],
        block_tables=case.block_tables[2:3],
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device=DEV),
        seq_lens=case.seq_lens[2:3],
    )
    assert torch.equal(paged_attention_triton(args), batch[2:3])


def test_gpu_paged_decode_row_same_in_mixed_batch():
    # a decoding sequence batched with another's prefill runs the prefill kernel: same bits as decode alone
    case = make_paged_case(
        [9000, 700], [1, 700], num_q_heads=4, num_kv_heads=1, head_dim=256, block_size=16, sliding_window=None, seed=7
    ).to(DEV)
    mixed = paged_attention_triton(case.args())
    args = dataclasses.replace(
        case.args(),
        q=case.q[:1],
        block_tables=case.block_tables[:1],
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device=DEV),
        seq_lens=case.seq_lens[:1],
    )
    assert torch.equal(paged_attention_triton(args), mixed[:1])
