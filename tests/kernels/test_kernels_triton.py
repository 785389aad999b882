"""Each Triton kernel against its PyTorch reference. Without CUDA the kernels run in Triton's interpreter on
CPU tensors (salon.kernels.triton_launch picks that per launch), so these tests run on any machine; shapes stay small
because the interpreter is slow. Large shapes on a real GPU are in test_kernels_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from kernels_cases import PAGED_CASES, make_paged_case

from salon.kernels.glu import geglu_ref, geglu_triton, swiglu_ref, swiglu_triton
from salon.kernels.kv_write import kv_write_ref, kv_write_triton
from salon.kernels.paged_attention import PagedAttentionArgs, paged_attention_ref, paged_attention_triton
from salon.kernels.quantize import (
    quantize_per_token_ref,
    quantize_per_token_triton,
    quantize_two_terms_ref,
    quantize_two_terms_triton,
    rmsnorm_quant_ref,
    rmsnorm_quant_triton,
)
from salon.kernels.rmsnorm import rmsnorm_ref, rmsnorm_triton
from salon.kernels.rope import rope_neox_ref, rope_neox_triton
from salon.kernels.w8a8_gemm import w8a8_gemm_ref, w8a8_gemm_triton
from tests.triton_interpreter import row_independent_dot as use_row_independent_dot

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("shape", [(1, 1), (7, 37), (3, 130), (16, 640)])
def test_quantize_per_token_bit_exact(shape):
    x = torch.randn(*shape, generator=_gen(shape[1])) * 3
    x[0, 0] = 0.5 * x[0].abs().max() / 127 * 127  # nudge a value near a half step
    if shape[0] > 2:
        x[1] = 0.0  # zero row
        x[2, : shape[1] // 2] = torch.tensor([1.5, 2.5, -0.5, 127.0] * 100)[: shape[1] // 2]  # exact ties
    q, s = quantize_per_token_triton(x.to(DEVICE))
    q_ref, s_ref = quantize_per_token_ref(x)
    assert torch.equal(q.cpu(), q_ref) and torch.equal(s.cpu(), s_ref)


@pytest.mark.parametrize("shape", [(1, 1), (7, 37), (3, 130), (4, 2048)])
def test_quantize_two_terms_bit_exact(shape):
    """Both terms from one launch: the first term's rows, then the residual's, with the reference's bits."""
    x = torch.randn(*shape, generator=_gen(shape[1] + 1)) * torch.logspace(-3, 3, shape[0])[:, None]
    if shape[0] > 2:
        x[1] = 0.0  # zero row: both terms zero, both scales the floor
        x[2, :4] = torch.tensor([1.5, 2.5, -0.5, 127.0])[: shape[1]]
    q, s = quantize_two_terms_triton(x.to(DEVICE))
    q_ref, s_ref = quantize_two_terms_ref(x)
    assert q.shape == (2 * shape[0], shape[1])
    assert torch.equal(q.cpu(), q_ref) and torch.equal(s.cpu(), s_ref)


GLUS = [pytest.param(geglu_triton, geglu_ref, id="geglu"), pytest.param(swiglu_triton, swiglu_ref, id="swiglu")]


@pytest.mark.parametrize("kernel,ref", GLUS)
@pytest.mark.parametrize("m,f", [(1, 1), (3, 7), (2, 1025), (5, 2048)])
def test_glu_bit_exact(m, f, kernel, ref):
    y = torch.randn(m, 2 * f, generator=_gen(m * 10_000 + f)) * torch.logspace(-4, 2, m)[:, None]
    assert torch.equal(kernel(y.to(DEVICE)).cpu(), ref(y))
    strided = torch.randn(m, 2 * f + 3, generator=_gen(f))[:, 1 : 2 * f + 1]  # a row stride that is not 2F
    assert torch.equal(kernel(strided.to(DEVICE)).cpu(), ref(strided))


@pytest.mark.parametrize("kernel,ref", GLUS)
def test_glu_every_range_of_the_gate(kernel, ref):
    """Gates from -1e6 to 1e6: the exp past both clamps, its zero below -87, g^3 overflowing."""
    gates = torch.cat(
        [
            torch.linspace(-60, 60, 4001),
            -torch.logspace(-30, 6, 999),
            torch.logspace(-30, 6, 999),
            torch.tensor([0.0, -0.0, 5.61, 5.62, -5.55, -5.56, -87.0, 88.0]),
        ]
    )
    ups = torch.randn(gates.numel(), generator=_gen(1)) * 3
    y = torch.cat([gates, ups])[None, :]
    assert torch.equal(kernel(y.to(DEVICE)).cpu(), ref(y))


def test_glu_refuses_bad_operands():
    with pytest.raises(ValueError, match="geglu"):
        geglu_triton(torch.randn(2, 7).to(DEVICE))
    with pytest.raises(ValueError, match="swiglu"):
        swiglu_triton(torch.randn(2, 8, dtype=torch.float64).to(DEVICE))


@pytest.mark.parametrize("shape", [(1, 3), (9, 37), (5, 640)])
def test_rmsnorm_quant_matches_reference(shape):
    g = _gen(shape[1])
    x, w = torch.randn(*shape, generator=g) * 4, torch.randn(shape[1], generator=g) + 1
    q, s = rmsnorm_quant_triton(x.to(DEVICE), w.to(DEVICE), 1e-6)
    q_ref, s_ref = rmsnorm_quant_ref(x, w, 1e-6)
    torch.testing.assert_close(s.cpu(), s_ref, rtol=1e-6, atol=0)
    diff = (q.cpu().int() - q_ref.int()).abs()
    assert diff.max() <= 1 and diff.float().mean() < 0.01  # only values on a rounding boundary may move


@pytest.mark.parametrize("shape", [(1, 3), (9, 37), (5, 640), (3, 2, 256)])
def test_rmsnorm_close_to_the_contract(shape):
    """tl.sum adds in its own order: within a few float32 ulps of the fixed-order contract, not bit for bit."""
    g = _gen(shape[-1])
    x, w = torch.randn(*shape, generator=g) * 4, torch.randn(shape[-1], generator=g) + 1
    y = rmsnorm_triton(x.to(DEVICE), w.to(DEVICE), 1e-6)
    assert y.shape == x.shape
    torch.testing.assert_close(y.cpu(), rmsnorm_ref(x, w, 1e-6), rtol=4e-6, atol=1e-6)


def test_rmsnorm_refuses_bad_operands():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight"):
        rmsnorm_triton(x.to(DEVICE), torch.ones(7).to(DEVICE), 1e-6)


GEMM_SHAPES = [  # M, K, N
    (1, 16, 16),
    (5, 37, 19),
    (33, 70, 42),
    (3, 1100, 10),
    (17, 256, 96),
]


@pytest.mark.parametrize("M,K,N", GEMM_SHAPES)
@pytest.mark.parametrize("epilogue", ["none", "bias", "residual", "bias_residual"])
def test_w8a8_gemm_bit_exact_without_geglu(M, K, N, epilogue):
    g = _gen(M * K + N)
    a = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    a_s, w_s = torch.rand(M, generator=g) / 50, torch.rand(N, generator=g) / 50
    bias = torch.randn(N, generator=g) if "bias" in epilogue else None
    res = torch.randn(M, N, generator=g) if "residual" in epilogue else None
    to = lambda t: None if t is None else t.to(DEVICE)
    out = w8a8_gemm_triton(to(a), to(a_s), to(w), to(w_s), bias=to(bias), residual=to(res))
    assert torch.equal(out.cpu(), w8a8_gemm_ref(a, a_s, w, w_s, bias=bias, residual=res))


@pytest.mark.parametrize("M,K,N", [(1, 16, 32), (5, 37, 38), (33, 70, 130)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_w8a8_gemm_geglu(M, K, N, with_bias):
    g = _gen(M + K + N)
    a = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    a_s, w_s = torch.rand(M, generator=g) / 100, torch.rand(N, generator=g) / 100
    bias = torch.randn(N, generator=g) if with_bias else None
    res = torch.randn(M, N // 2, generator=g)
    out = w8a8_gemm_triton(
        a.to(DEVICE),
        a_s.to(DEVICE),
        w.to(DEVICE),
        w_s.to(DEVICE),
        bias=None if bias is None else bias.to(DEVICE),
        residual=res.to(DEVICE),
        geglu=True,
    )
    ref = w8a8_gemm_ref(a, a_s, w, w_s, bias=bias, residual=res, geglu=True)
    assert out.shape == (M, N // 2)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_w8a8_gemm_rejects_bad_arguments():
    a = torch.zeros(2, 8, dtype=torch.int8, device=DEVICE)
    w = torch.zeros(4, 8, dtype=torch.int8, device=DEVICE)
    s2, s4 = torch.ones(2, device=DEVICE), torch.ones(4, device=DEVICE)
    with pytest.raises(ValueError, match="w_q: expected 8 columns"):
        w8a8_gemm_triton(a, s2, w[:, :7], s4)
    with pytest.raises(ValueError, match="a_q: expected dtype torch.int8"):
        w8a8_gemm_triton(a.float(), s2, w, s4)
    with pytest.raises(ValueError, match="residual: expected shape"):
        w8a8_gemm_triton(a, s2, w, s4, residual=torch.zeros(2, 4, device=DEVICE), geglu=True)


@pytest.mark.parametrize("T,H,D", [(1, 1, 2), (5, 3, 10), (7, 4, 64)])
def test_rope_neox_matches_reference(T, H, D):
    g = _gen(T * H * D)
    x = torch.randn(T, H, D, generator=g)
    positions = torch.randint(0, 40000, (T,), generator=g)
    positions[0] = 0
    out = rope_neox_triton(x.to(DEVICE), positions.to(DEVICE), 10000.0)
    torch.testing.assert_close(out.cpu(), rope_neox_ref(x, positions, 10000.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T,H,D,BS", [(1, 1, 8, 4), (6, 2, 7, 3), (9, 1, 32, 16)])
def test_kv_write_bit_exact(T, H, D, BS):
    g = _gen(T * H * D)
    NB = (T + BS - 1) // BS + 2
    k, v = torch.randn(T, H, D, generator=g), torch.randn(T, H, D, generator=g)
    k[0, 0] = 0.0
    slots = torch.randperm(NB * BS, generator=g)[:T]
    caches = [torch.randint(-127, 128, (NB, BS, H, D), generator=g, dtype=torch.int8) for _ in range(2)]
    scales = [torch.rand(NB, BS, H, generator=g) for _ in range(2)]
    expected = [t.clone() for t in caches + scales]
    kv_write_ref(k, v, *expected, slots)
    got = [t.to(DEVICE) for t in caches + scales]
    kv_write_triton(k.to(DEVICE), v.to(DEVICE), *got, slots.to(DEVICE))
    for name, a, b in zip(["k_cache", "v_cache", "k_scale", "v_scale"], got, expected):
        assert torch.equal(a.cpu(), b), name  # untouched slots keep their old contents too


def _case(name, seed=None, **overrides):
    seq_lens, q_lens, hq, hkv, d, bs, window = PAGED_CASES[name]
    return make_paged_case(
        seq_lens,
        q_lens,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        block_size=bs,
        sliding_window=window,
        seed=len(name) if seed is None else seed,
        **overrides,
    )


@pytest.mark.parametrize("name", sorted(PAGED_CASES))
def test_paged_attention_matches_reference(name):
    case = _case(name)
    out = paged_attention_triton(case.to(DEVICE).args())
    torch.testing.assert_close(out.cpu(), paged_attention_ref(case.args()), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["decode_batch_mqa", "chunked_prefill_gqa", "mixed_with_empty_query"])
def test_paged_attention_on_float_caches_matches_reference(name, dtype):
    case = _case(name).as_float(dtype)
    out = paged_attention_triton(case.to(DEVICE).args())
    torch.testing.assert_close(out.cpu(), paged_attention_ref(case.args()), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(PAGED_CASES))
def test_paged_attention_never_touches_unused_table_entries(name):
    # unused entries point at a real block whose scales are NaN: a kernel that loads it, even masked to zero
    # weight afterwards, returns NaN
    case = _case(name, poison="nan_block")
    out = paged_attention_triton(case.to(DEVICE).args()).cpu()
    assert not out.isnan().any()
    torch.testing.assert_close(out, paged_attention_ref(case.args()), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window", [None, 37, 16])
def test_paged_decode_split_kv_long_context(window):
    # 100-key contexts over 16-key splits: up to 7 partials per sequence, some splits before the window
    case = make_paged_case(
        [100, 37, 64, 1],
        [1, 1, 1, 1],
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=16,
        block_size=8,
        sliding_window=window,
        seed=7,
    )
    out = paged_attention_triton(case.to(DEVICE).args(), split_tokens=16 if DEVICE == "cpu" else 64)
    torch.testing.assert_close(out.cpu(), paged_attention_ref(case.args()), rtol=1e-4, atol=1e-5)


@pytest.fixture
def row_independent_dot(monkeypatch):
    """tests/triton_interpreter.py: the interpreter checks the kernels' own batch invariance bit for bit."""
    if DEVICE == "cpu":
        use_row_independent_dot(monkeypatch)


def _sub_batch(case, rows: slice, seqs: slice, q_lens: list[int]) -> PagedAttentionArgs:
    """Arguments for querying some of `case`'s sequences, over the same cache."""
    return dataclasses.replace(
        case.args(),
        q=case.q[rows],
        block_tables=case.block_tables[seqs],
        seq_lens=case.seq_lens[seqs],
        query_start_loc=torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE),
    )


def test_paged_decode_is_batch_invariant(row_independent_dot):
    batch = make_paged_case(
        [45, 20, 9], [1, 1, 1], num_q_heads=4, num_kv_heads=1, head_dim=16, block_size=4, sliding_window=None, seed=3
    ).to(DEVICE)
    out_batch = paged_attention_triton(batch.args())
    out_alone = paged_attention_triton(_sub_batch(batch, slice(1, 2), slice(1, 2), [1]))
    assert torch.equal(out_batch[1:2], out_alone)


@pytest.mark.parametrize("window", [None, 19])
def test_paged_prefill_chunked_equals_whole(row_independent_dot, window):
    whole = make_paged_case(
        [45], [45], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4, sliding_window=window, seed=5
    ).to(DEVICE)
    out_whole = paged_attention_triton(whole.args())
    chunks = []  # the same cache queried as chunks [0, 20), [20, 21) and [21, 45); [20, 21) runs as decode
    for lo, hi in [(0, 20), (20, 21), (21, 45)]:
        args = dataclasses.replace(
            whole.args(),
            q=whole.q[lo:hi],
            query_start_loc=torch.tensor([0, hi - lo], dtype=torch.int32, device=DEVICE),
            seq_lens=torch.tensor([hi], dtype=torch.int32, device=DEVICE),
        )
        chunks.append(paged_attention_triton(args))
    assert torch.equal(torch.cat(chunks), out_whole)


def test_paged_decode_row_same_in_mixed_batch(row_independent_dot):
    # a decoding sequence batched with another's prefill runs the prefill kernel: same bits as decode alone
    mixed = make_paged_case(
        [53, 23], [1, 23], num_q_heads=4, num_kv_heads=1, head_dim=16, block_size=4, sliding_window=30, seed=8
    ).to(DEVICE)
    out_mixed = paged_attention_triton(mixed.args())
    out_alone = paged_attention_triton(_sub_batch(mixed, slice(0, 1), slice(0, 1), [1]))
    assert torch.equal(out_mixed[:1], out_alone)
    torch.testing.assert_close(out_mixed.cpu(), paged_attention_ref(mixed.to("cpu").args()), rtol=1e-4, atol=1e-5)


def test_paged_attention_rejects_bad_arguments():
    case = _case("decode_batch_mqa").to(DEVICE)
    with pytest.raises(ValueError, match="block_tables: expected dtype torch.int32"):
        paged_attention_triton(dataclasses.replace(case.args(), block_tables=case.block_tables.long()))
    gqa = _case("chunked_prefill_gqa").to(DEVICE)  # 4 query heads over 2 KV heads
    with pytest.raises(ValueError, match="not a multiple"):
        paged_attention_triton(dataclasses.replace(gqa.args(), q=gqa.q[:, :3]))
    with pytest.raises(ValueError, match="sliding_window"):
        paged_attention_triton(dataclasses.replace(case.args(), sliding_window=0))
