"""salon/kernels/cpu/paged_attention.py (the C kernels: AVX-512 and AVX2, each where the CPU runs it) and
paged_attention_torch.py (the PyTorch path) against the reference, on awkward shapes, and their batch/chunk
invariance."""

from __future__ import annotations

import random

import pytest
import torch

from salon.kernels.cpu import paged_attention as cpu_attention
from salon.kernels.cpu.paged_attention_torch import paged_attention_torch
from salon.kernels.kv_write import kv_write_ref
from salon.kernels.paged_attention import PagedAttentionArgs
from salon.kernels.paged_attention import paged_attention_ref as _paged_attention_ref

NUM_BLOCKS = 512


def positional(fn):
    """fn(PagedAttentionArgs) called with the arguments in the dataclass's field order."""
    return lambda *args: fn(PagedAttentionArgs(*args))


paged_attention_ref = positional(_paged_attention_ref)
paged_attention_c = positional(cpu_attention.paged_attention_c)
C_KERNELS = ["avx512", "avx2"]  # paged_attention_avx512.c, paged_attention_avx2.c
paged_attention_cpu = positional(cpu_attention.paged_attention_cpu)


def build_case(seq_lens, q_lens, hq, hkv, d, bs, window, seed=0, poison=True):
    """Random cache contents; blocks no query can see get out-of-range table entries (poison)."""
    gen = torch.Generator().manual_seed(seed)
    kc = torch.zeros(NUM_BLOCKS, bs, hkv, d, dtype=torch.int8)
    vc, ks, vs = kc.clone(), torch.zeros(NUM_BLOCKS, bs, hkv), torch.zeros(NUM_BLOCKS, bs, hkv)
    perm = torch.randperm(NUM_BLOCKS, generator=gen)
    max_blocks = max(-(-s // bs) for s in seq_lens) + 2
    tables = torch.full((len(seq_lens), max_blocks), 10**6, dtype=torch.int32)  # past the end: poison
    used = 0
    for s, n in enumerate(seq_lens):
        nb = -(-n // bs)
        tables[s, :nb] = perm[used : used + nb].to(torch.int32)
        used += nb
        pos = torch.arange(n)
        slots = tables[s, pos // bs].long() * bs + pos % bs
        kv_write_ref(
            torch.randn(n, hkv, d, generator=gen) * 3, torch.randn(n, hkv, d, generator=gen), kc, vc, ks, vs, slots
        )
        if window is not None and poison:
            first_visible = max(0, n - q_lens[s] - window + 1)
            tables[s, : first_visible // bs] = -7  # released blocks: any id, never read
    q = torch.randn(sum(q_lens), hq, d, generator=gen)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return q, kc, vc, ks, vs, tables, qsl, torch.tensor(seq_lens, dtype=torch.int32)


def sanitized(tables):
    t = tables.clone()
    t[(t < 0) | (t >= NUM_BLOCKS)] = 0
    return t


CASES = [
    # seq_lens, q_lens, Hq, Hkv, D, BS, window
    ([1], [1], 4, 1, 256, 16, None),
    ([37, 100, 5], [37, 1, 2], 4, 2, 16, 16, 32),
    ([600, 70], [1, 70], 4, 1, 64, 16, 512),
    ([130, 300, 17], [50, 3, 17], 8, 2, 32, 8, 17),
    ([1000], [1], 4, 1, 256, 16, 512),
    ([65, 64, 63], [65, 1, 30], 2, 2, 8, 32, 1),
    ([200], [200], 6, 3, 24, 16, None),
    ([300, 45, 160], [1, 1, 33], 4, 1, 64, 16, None),
]


CASES += [
    ([2000, 513, 9], [3, 40, 9], 4, 1, 256, 16, 512),  # Gemma's shapes: a window cutting blocks, long context
    ([90, 31], [90, 1], 16, 2, 48, 4, None),  # 8 query heads per KV head (the C kernel's most), tiny blocks
    ([400, 77, 3, 130], [1, 77, 3, 2], 9, 3, 64, 16, None),  # SmolLM2's shapes: 3 query heads per KV head
    ([700, 77, 520], [1, 77, 5], 9, 3, 64, 16, 512),  # ... with a window and a context past it
]


def implementation(name):
    """The attention function under test: a C kernel ("avx512", "avx2"; skipped where this CPU cannot run it)
    or the PyTorch path ("torch")."""
    if name == "torch":
        return positional(paged_attention_torch)
    if name not in cpu_attention.c_isas():
        pytest.skip(f"this CPU does not run the {name} C kernel")

    def c_kernel(q, *args):
        out = cpu_attention.paged_attention_c(PagedAttentionArgs(q, *args), isa=name)
        assert out is not None, "the C kernel refused shapes it supports"
        return out

    return c_kernel


def c_supports(hq, hkv, d, isa):
    return cpu_attention.c_kernel_supports(hq, hkv, d, isa)


@pytest.mark.parametrize("impl", [*C_KERNELS, "torch"])
@pytest.mark.parametrize("case", CASES)
def test_matches_reference(impl, case):
    seq_lens, q_lens, hq, hkv, d, bs, window = case
    attend = implementation(impl)
    q, kc, vc, ks, vs, tables, qsl, lens = build_case(seq_lens, q_lens, hq, hkv, d, bs, window)
    if impl != "torch" and not c_supports(hq, hkv, d, impl):
        # A head size that is not a multiple of 16: the C kernel declines, and the dispatcher runs the PyTorch path.
        assert d % 16 != 0
        assert (
            cpu_attention.paged_attention_c(
                PagedAttentionArgs(q, kc, vc, ks, vs, tables, qsl, lens, 0.125, window), isa=impl
            )
            is None
        )
        attend = paged_attention_cpu
    # The oracle: the reference's arithmetic in float64 (the float32 reference's own rounding reaches the
    # tolerance on Gemma's long-window case, 2.0e-5 where the PyTorch path is 1.2e-5 and the C kernel 3.8e-6 off).
    ref = paged_attention_ref(q.double(), kc, vc, ks, vs, sanitized(tables), qsl, lens, 0.125, window)
    out = attend(q, kc, vc, ks, vs, tables, qsl, lens, 0.125, window)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("impl", C_KERNELS)
def test_c_kernel_at_its_limits(impl):
    """8 query heads per KV head and head size 512, the most the C kernels' buffers hold (prefill chunks in
    tiny blocks, a short window)."""
    attend = implementation(impl)
    assert cpu_attention.c_limits(impl) == (8, 512)
    q, kc, vc, ks, vs, tables, qsl, lens = build_case([50, 33], [50, 33], 16, 2, 512, 8, 20)
    ref = paged_attention_ref(q, kc, vc, ks, vs, sanitized(tables), qsl, lens, 0.125, 20)
    torch.testing.assert_close(attend(q, kc, vc, ks, vs, tables, qsl, lens, 0.125, 20), ref, rtol=1e-5, atol=2e-5)


def test_the_dispatcher_runs_this_cpus_first_c_kernel():
    if not cpu_attention.c_isas():
        pytest.skip("no C kernel runs on this CPU")
    q, kc, vc, ks, vs, tables, qsl, lens = build_case([70, 9], [70, 1], 4, 1, 64, 16, 32)
    first = cpu_attention.paged_attention_c(
        PagedAttentionArgs(q, kc, vc, ks, vs, tables, qsl, lens, 0.125, 32), isa=cpu_attention.c_isas()[0]
    )
    assert torch.equal(paged_attention_cpu(q, kc, vc, ks, vs, tables, qsl, lens, 0.125, 32), first)


def test_c_kernel_declines_unsupported_shapes_and_the_dispatcher_falls_back():
    q, kc, vc, ks, vs, tables, qsl, lens = build_case([20], [20], 4, 1, 24, 16, None)
    assert paged_attention_c(q, kc, vc, ks, vs, tables, qsl, lens, 0.125, None) is None
    torch.testing.assert_close(
        paged_attention_cpu(q, kc, vc, ks, vs, tables, qsl, lens, 0.125, None),
        paged_attention_ref(q, kc, vc, ks, vs, tables, qsl, lens, 0.125, None),
        rtol=1e-5,
        atol=2e-5,
    )


# C: the G = 4 and G = 3 paths (constant-folded in paged_attention_avx2.c's build) and the generic one
@pytest.mark.parametrize(
    "impl,heads", [*((c, heads) for c in C_KERNELS for heads in [(4, 1), (9, 3), (6, 2)]), ("torch", (4, 1))]
)
@pytest.mark.parametrize("window", [None, 40])
def test_each_query_is_invariant_to_its_batch_and_chunk(impl, heads, window):
    paged_attention_cpu = implementation(impl)
    seq_lens, q_lens = [300, 70, 160, 45], [1, 70, 33, 1]
    q, kc, vc, ks, vs, tables, qsl, lens = build_case(seq_lens, q_lens, *heads, 64, 16, window, seed=3)
    full = paged_attention_cpu(q, kc, vc, ks, vs, tables, qsl, lens, 0.0625, window)
    for s in range(len(seq_lens)):
        a, b = int(qsl[s]), int(qsl[s + 1])
        alone = paged_attention_cpu(
            q[a:b],
            kc,
            vc,
            ks,
            vs,
            tables[s : s + 1],
            torch.tensor([0, b - a], dtype=torch.int32),
            lens[s : s + 1],
            0.0625,
            window,
        )
        assert torch.equal(alone, full[a:b])
        # Every query as a one-token step (decode), and the chunk split in two uneven parts.
        for j in range(b - a):
            one = paged_attention_cpu(
                q[a + j : a + j + 1],
                kc,
                vc,
                ks,
                vs,
                tables[s : s + 1],
                torch.tensor([0, 1], dtype=torch.int32),
                torch.tensor([seq_lens[s] - (b - a) + j + 1], dtype=torch.int32),
                0.0625,
                window,
            )
            assert torch.equal(one[0], alone[j])
        if b - a > 3:
            cut = (b - a) // 3
            first = paged_attention_cpu(
                q[a : a + cut],
                kc,
                vc,
                ks,
                vs,
                tables[s : s + 1],
                torch.tensor([0, cut], dtype=torch.int32),
                torch.tensor([seq_lens[s] - (b - a) + cut], dtype=torch.int32),
                0.0625,
                window,
            )
            assert torch.equal(first, alone[:cut])


@pytest.mark.parametrize("impl", C_KERNELS)
@pytest.mark.parametrize("seed", range(12))
def test_c_kernel_on_random_batches_matches_reference_and_is_invariant(impl, seed):
    """Seeded random batches (mixed prefills and decodes, windows cutting blocks, G = 4, 3 and others): the C
    kernel against the reference, and each sequence alone against the batch, bit for bit."""
    attend = implementation(impl)
    rng = random.Random(seed)
    hkv = rng.choice([1, 2])
    hq = hkv * rng.choice([4, 4, 3, 2, 8])
    d = rng.choice([16, 32, 64])
    bs = rng.choice([4, 8, 16, 32])
    window = rng.choice([None, rng.randint(1, 80)])
    seq_lens, q_lens = [], []
    for _ in range(rng.randint(1, 5)):
        n = rng.randint(1, 300)
        seq_lens.append(n)
        q_lens.append(rng.choice([1, rng.randint(1, n)]))
    q, kc, vc, ks, vs, tables, qsl, lens = build_case(seq_lens, q_lens, hq, hkv, d, bs, window, seed=seed)
    out = attend(q, kc, vc, ks, vs, tables, qsl, lens, 0.1, window)
    ref = paged_attention_ref(q, kc, vc, ks, vs, sanitized(tables), qsl, lens, 0.1, window)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-5)
    for s in range(len(seq_lens)):
        a, b = int(qsl[s]), int(qsl[s + 1])
        alone = attend(
            q[a:b],
            kc,
            vc,
            ks,
            vs,
            tables[s : s + 1],
            torch.tensor([0, b - a], dtype=torch.int32),
            lens[s : s + 1],
            0.1,
            window,
        )
        assert torch.equal(alone, out[a:b])
