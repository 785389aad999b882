"""The plain PyTorch references against independent formulations and hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from kernels_cases import PAGED_CASES, dense_attention, make_paged_case

from salon.kernels.kv_write import kv_write_ref
from salon.kernels.paged_attention import paged_attention_ref
from salon.kernels.quantize import SCALE_FLOOR, quantize_per_token_ref, rmsnorm_quant_ref
from salon.kernels.rope import rope_neox_ref
from salon.kernels.w8a8_gemm import w8a8_gemm_ref


def test_quantize_exact_values_ties_to_even_and_zero_rows():
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5], [0.0] * 8, [-254.0, 3.0, 1.0, 0, 0, 0, 0, 0]])
    q, scale = quantize_per_token_ref(x)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert q[0].tolist() == [127, 0, 2, 2, 0, -2, -2, 126]
    assert q[1].tolist() == [0] * 8 and scale[1].item() == SCALE_FLOOR > 0
    assert q[2].tolist() == [-127, 2, 0, 0, 0, 0, 0, 0]  # 3/2 = 1.5 -> 2, 1/2 = 0.5 -> 0
    assert scale.tolist() == [1.0, SCALE_FLOOR, 2.0]


def test_quantize_roundtrip_error_is_half_a_step():
    x = torch.randn(33, 17, generator=torch.Generator().manual_seed(1)) * 5
    q, scale = quantize_per_token_ref(x)
    assert q.abs().amax(dim=1).eq(127).all()  # every row's absmax lands on +-127
    err = (q.float() * scale[:, None] - x).abs()
    assert (err <= scale[:, None] * 0.5 + 1e-6).all()


def test_rmsnorm_quant_matches_float64_formula():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(9, 31, generator=g), torch.randn(31, generator=g) + 1
    q, scale = rmsnorm_quant_ref(x, w, 1e-6)
    xd = x.double()
    y = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(scale.double(), y.abs().amax(-1) / 127, rtol=1e-6, atol=0)
    assert (q.double() - y / scale.double()[:, None]).abs().max() <= 0.5 + 1e-4


@pytest.mark.parametrize("K", [1, 7, 1024, 1025, 2600])
def test_w8a8_gemm_integer_accumulation_is_exact(K):
    g = torch.Generator().manual_seed(K)
    M, N = 5, 6
    a = torch.full((M, K), 127, dtype=torch.int8)
    a[1:] = torch.randint(-127, 128, (M - 1, K), generator=g, dtype=torch.int8)
    w = torch.full((N, K), -127, dtype=torch.int8)
    w[1:] = torch.randint(-127, 128, (N - 1, K), generator=g, dtype=torch.int8)
    exact = a.long() @ w.long().T  # int64 matmul on CPU
    ones_m, ones_n = torch.ones(M), torch.ones(N)
    out = w8a8_gemm_ref(a, ones_m, w, ones_n)
    assert out[0, 0].item() == -127 * 127 * K
    torch.testing.assert_close(out.double(), exact.double(), rtol=0, atol=exact.abs().max().item() * 2**-23)


def test_w8a8_gemm_epilogue_order():
    g = torch.Generator().manual_seed(3)
    M, K, N = 3, 11, 8
    a = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    a_s, w_s = torch.rand(M, generator=g) / 100, torch.rand(N, generator=g) / 100
    bias, res = torch.randn(N, generator=g), torch.randn(M, N // 2, generator=g)
    y = (a.double() @ w.double().T) * a_s.double()[:, None] * w_s.double()[None, :] + bias.double()
    gate, up = y[:, : N // 2], y[:, N // 2 :]
    gelu = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
    expected = gelu * up + res.double()
    out = w8a8_gemm_ref(a, a_s, w, w_s, bias=bias, residual=res, geglu=True)
    assert out.shape == (M, N // 2)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    plain = w8a8_gemm_ref(a, a_s, w, w_s, residual=torch.ones(M, N))
    torch.testing.assert_close(plain.double(), y - bias.double() + 1, rtol=1e-5, atol=1e-5)


def test_rope_matches_complex_rotation():
    g = torch.Generator().manual_seed(4)
    T, H, D, base = 5, 3, 8, 10000.0
    x = torch.randn(T, H, D, generator=g)
    positions = torch.tensor([0, 1, 7, 511, 32000])
    out = rope_neox_ref(x, positions, base)
    torch.testing.assert_close(out[0], x[0])  # position 0 is the identity
    inv_freq = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = positions.double()[:, None] * inv_freq
    z = (
        torch.complex(x[..., : D // 2].double(), x[..., D // 2 :].double())
        * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    )
    expected = torch.cat((z.real, z.imag), dim=-1)
    # float32 angles at position 32000 carry ~2e-3 rad of rounding, as in every float32 RoPE
    torch.testing.assert_close(out[:4].double(), expected[:4], rtol=0, atol=2e-4)
    torch.testing.assert_close(out[4].double(), expected[4], rtol=0, atol=2e-2)


def test_kv_write_scatters_quantized_rows_to_slots():
    g = torch.Generator().manual_seed(5)
    NB, BS, H, D, T = 4, 3, 2, 5, 4
    k, v = torch.randn(T, H, D, generator=g), torch.randn(T, H, D, generator=g)
    k_cache = torch.zeros(NB, BS, H, D, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    k_scale, v_scale = torch.zeros(NB, BS, H), torch.zeros(NB, BS, H)
    slots = torch.tensor([11, 0, 4, 5])  # block 3 offset 2, block 0 offset 0, block 1 offsets 1 and 2
    kv_write_ref(k, v, k_cache, v_cache, k_scale, v_scale, slots)
    for t, (b, o) in enumerate([(3, 2), (0, 0), (1, 1), (1, 2)]):
        for h in range(H):
            qk, sk = quantize_per_token_ref(k[t, h][None])
            qv, sv = quantize_per_token_ref(v[t, h][None])
            assert torch.equal(k_cache[b, o, h], qk[0]) and k_scale[b, o, h] == sk[0]
            assert torch.equal(v_cache[b, o, h], qv[0]) and v_scale[b, o, h] == sv[0]
    assert k_cache[2].eq(0).all() and k_scale[0, 1:].eq(0).all()  # untouched slots


@pytest.mark.parametrize("name", sorted(PAGED_CASES))
def test_paged_attention_ref_matches_dense_sdpa(name):
    seq_lens, q_lens, hq, hkv, d, bs, window = PAGED_CASES[name]
    case = make_paged_case(
        seq_lens,
        q_lens,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        block_size=bs,
        sliding_window=window,
        seed=len(name),
    )
    out = paged_attention_ref(case.args())
    torch.testing.assert_close(out, dense_attention(case), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(PAGED_CASES))
def test_paged_attention_ref_on_float_caches_matches_dense_sdpa(name, dtype):
    seq_lens, q_lens, hq, hkv, d, bs, window = PAGED_CASES[name]
    case = make_paged_case(
        seq_lens,
        q_lens,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        block_size=bs,
        sliding_window=window,
        seed=len(name),
    ).as_float(dtype)
    torch.testing.assert_close(paged_attention_ref(case.args()), dense_attention(case), rtol=1e-5, atol=1e-5)


def test_kv_write_ref_stores_float_caches_as_they_are():
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(3, 2, 8, generator=g), torch.randn(3, 2, 8, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        kc, vc = torch.zeros(4, 4, 2, 8, dtype=dtype), torch.zeros(4, 4, 2, 8, dtype=dtype)
        kv_write_ref(k, v, kc, vc, None, None, torch.tensor([13, 0, 6]))
        assert torch.equal(kc[3, 1], k[0].to(dtype)) and torch.equal(vc[1, 2], v[2].to(dtype))
        assert kc[2].eq(0).all()


@pytest.mark.parametrize("name", sorted(PAGED_CASES))
def test_paged_attention_ref_never_touches_unused_table_entries(name):
    seq_lens, q_lens, hq, hkv, d, bs, window = PAGED_CASES[name]
    case = make_paged_case(
        seq_lens,
        q_lens,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        block_size=bs,
        sliding_window=window,
        seed=len(name),
        poison="nan_block",
    )
    out = paged_attention_ref(case.args())
    assert not out.isnan().any()
    torch.testing.assert_close(out, dense_attention(case), rtol=1e-5, atol=1e-5)


def test_paged_attention_window_of_one_returns_own_value():
    case = make_paged_case([9], [3], num_q_heads=2, num_kv_heads=1, head_dim=8, block_size=4, sliding_window=1, seed=0)
    out = paged_attention_ref(case.args())
    own_v = case.dense_v[0][6:9]  # positions 6, 7, 8 see only themselves
    torch.testing.assert_close(out, own_v.expand(3, 2, 8), rtol=1e-6, atol=1e-6)
