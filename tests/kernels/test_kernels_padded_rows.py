"""Padded rows of a fixed-size decode batch (salon/engine/worker/cuda_graphs.py) in every kernel that sees them.

A padded row has slot -1 in the KV write, and a sequence of length 0 (one query row, a table of ids no kernel
may read) in paged attention. Every KV write implementation (the reference, the Triton kernel, each C build)
leaves every cache byte unchanged for it; every paged attention implementation (the reference, the Triton
kernel, each C build, the CPU's PyTorch path) gives it zeros, reads nothing for it, and gives the live rows
of the same call the bits they get without the padding, with the table as wide as the engine's fixed width.
Without CUDA the Triton kernels run in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
from kernels_cases import make_paged_case

from salon.kernels.cpu import native
from salon.kernels.cpu import paged_attention as cpu_attention
from salon.kernels.cpu.kv_write import kv_write_cpu
from salon.kernels.cpu.paged_attention_torch import paged_attention_torch
from salon.kernels.kv_write import kv_write_ref, kv_write_triton
from salon.kernels.paged_attention import PagedAttentionArgs, paged_attention_ref, paged_attention_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

KV_WRITES = ["ref", "triton", *(f"c-{isa}" for isa in native.simd_isas())]
ATTENTIONS = ["ref", "triton", "torch", *(f"c-{isa}" for isa in cpu_attention.c_isas())]


def kv_write(name: str):
    if name == "ref":
        return kv_write_ref
    if name == "triton":

        def on_device(k, v, *caches_and_slots):
            *caches, slots = caches_and_slots
            moved = [c.to(DEVICE) for c in caches]
            kv_write_triton(k.to(DEVICE), v.to(DEVICE), *moved, slots.to(DEVICE))
            for c, m in zip(caches, moved):
                c.copy_(m.cpu())

        return on_device
    isa = name.removeprefix("c-")
    return lambda *args: kv_write_cpu(*args, isa=isa)


def random_caches(g: torch.Generator, num_blocks: int, bs: int, h: int, d: int) -> list[torch.Tensor]:
    """Noise everywhere, so that any byte a write touches shows."""
    return [
        torch.randint(-127, 128, (num_blocks, bs, h, d), generator=g, dtype=torch.int8),
        torch.randint(-127, 128, (num_blocks, bs, h, d), generator=g, dtype=torch.int8),
        torch.rand(num_blocks, bs, h, generator=g),
        torch.rand(num_blocks, bs, h, generator=g),
    ]


@pytest.mark.parametrize("impl", KV_WRITES)
@pytest.mark.parametrize("t,h,d", [(1, 1, 16), (5, 2, 17), (9, 1, 64)])
def test_kv_write_of_padded_rows_changes_no_cache_byte(impl, t, h, d):
    g = torch.Generator().manual_seed(t * 100 + h * 10 + d)
    num_blocks, bs = 6, 4
    k, v = torch.randn(t, h, d, generator=g), torch.randn(t, h, d, generator=g)
    caches = random_caches(g, num_blocks, bs, h, d)
    before = [c.clone() for c in caches]
    kv_write(impl)(k, v, *caches, torch.full((t,), -1, dtype=torch.int64))
    for name, a, b in zip(["k_cache", "v_cache", "k_scale", "v_scale"], caches, before):
        assert torch.equal(a, b), f"{name}: a padded row wrote into the cache"


@pytest.mark.parametrize("impl", KV_WRITES)
def test_kv_write_of_live_rows_between_padded_ones_is_the_live_rows_write(impl):
    g = torch.Generator().manual_seed(7)
    t, h, d, num_blocks, bs = 7, 2, 32, 5, 4
    k, v = torch.randn(t, h, d, generator=g) * 3, torch.randn(t, h, d, generator=g)
    slots = torch.tensor([3, -1, 17, -1, -1, 0, 9])
    live = slots >= 0
    caches = random_caches(g, num_blocks, bs, h, d)
    expected = [c.clone() for c in caches]
    kv_write_ref(k[live], v[live], *expected, slots[live])
    kv_write(impl)(k, v, *caches, slots)
    for name, a, b in zip(["k_cache", "v_cache", "k_scale", "v_scale"], caches, expected):
        assert torch.equal(a, b), name


def attention(name: str):
    if name == "ref":
        return paged_attention_ref
    if name == "triton":

        def on_device(a: PagedAttentionArgs) -> torch.Tensor:
            moved = {
                f: (getattr(a, f).to(DEVICE) if isinstance(getattr(a, f), torch.Tensor) else getattr(a, f))
                for f in a.__dataclass_fields__
            }
            return paged_attention_triton(PagedAttentionArgs(**moved)).cpu()

        return on_device
    if name == "torch":
        return paged_attention_torch
    isa = name.removeprefix("c-")

    def c_kernel(a: PagedAttentionArgs) -> torch.Tensor:
        out = cpu_attention.paged_attention_c(a, isa=isa)
        assert out is not None, "the C kernel declined shapes it supports"
        return out

    return c_kernel


def padded(a: PagedAttentionArgs, num_padded: int, width: int, poison: int, g: torch.Generator):
    """`a` (one query per sequence) with num_padded padded sequences after its own (length 0, one query row each,
    a table row of `poison` ids) and every table row widened to `width` columns of `poison`."""
    s, t = a.block_tables.shape[0], a.q.shape[0]
    tables = torch.full((s + num_padded, width), poison, dtype=torch.int32)
    tables[:s, : a.block_tables.shape[1]] = a.block_tables
    q = torch.cat([a.q, torch.randn(num_padded, *a.q.shape[1:], generator=g)])
    qsl = torch.cat([a.query_start_loc, t + torch.arange(1, num_padded + 1, dtype=torch.int32)])
    seq_lens = torch.cat([a.seq_lens, torch.zeros(num_padded, dtype=torch.int32)])
    return PagedAttentionArgs(
        q, a.k_cache, a.v_cache, a.k_scale, a.v_scale, tables, qsl, seq_lens, a.sm_scale, a.sliding_window
    )


@pytest.mark.parametrize("impl", ATTENTIONS)
@pytest.mark.parametrize(
    "seq_lens,hq,hkv,bs,window",
    [
        ([5, 23, 40], 4, 1, 4, None),  # Gemma's shape of heads: one KV head
        ([1, 17, 33, 2], 4, 2, 16, 9),  # a window cutting blocks, GQA
    ],
)
@pytest.mark.parametrize("num_padded", [1, 5])
def test_decode_attention_of_padded_rows_is_zero_and_leaves_live_rows_bits(
    impl, seq_lens, hq, hkv, bs, window, num_padded
):
    case = make_paged_case(
        seq_lens,
        [1] * len(seq_lens),
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=32,
        block_size=bs,
        sliding_window=window,
        seed=len(seq_lens) + num_padded,
    )
    fn = attention(impl)
    want = fn(case.args())
    poison = case.k_cache.shape[0] + 1000  # an id past the cache: reading it faults or shows
    wide = padded(case.args(), num_padded, case.block_tables.shape[1] + 9, poison, torch.Generator().manual_seed(1))
    got = fn(wide)
    t = case.q.shape[0]
    assert torch.equal(got[:t], want), f"live rows differ by {(got[:t] - want).abs().max().item():.3e}"
    assert torch.equal(got[t:], torch.zeros_like(got[t:])), "a padded row's output is not zero"


@pytest.mark.parametrize("impl", ATTENTIONS)
def test_decode_attention_of_a_batch_of_padded_rows_only(impl):
    """The capture of a CUDA graph runs a batch of padded rows alone: no key anywhere, zeros out."""
    case = make_paged_case(
        [3], [1], num_q_heads=4, num_kv_heads=1, head_dim=32, block_size=4, sliding_window=None, seed=3
    )
    a = padded(case.args(), 4, 6, 0, torch.Generator().manual_seed(2))
    only_padded = PagedAttentionArgs(
        a.q[1:],
        a.k_cache,
        a.v_cache,
        a.k_scale,
        a.v_scale,
        a.block_tables[1:].contiguous(),
        a.query_start_loc[1:] - 1,
        a.seq_lens[1:],
        a.sm_scale,
        a.sliding_window,
    )
    out = attention(impl)(only_padded)
    assert torch.equal(out, torch.zeros_like(out))
