"""The fused int8 Linear in one C call (salon/kernels/cpu/linear_two_terms.h, in each build this CPU runs: around the
AVX-512 VNNI GEMM and around the AVX2 one), in both activation recipes (two int8 terms; one int16 term through
w16a8_grouped.c), against salon.kernels.linear_two_terms's references, bit for bit: every
combination of the norm before, the post-norm and the residual, decode and small-batch row counts up to
MAX_ROWS, the kernels' 8- and 16-row blocks and short last blocks, strided rows; and the calls it declines
(more rows, per-row weight scales, other dtypes), where linear_two_terms_cpu composes the CPU family's
kernels with the same bits. Inputs span magnitudes, so a dropped rounding, a fused multiply-add or a norm over
the wrong length changes the bits (checked against mutated kernels by hand)."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

from salon.kernels.cpu import native
from salon.kernels.cpu.linear_two_terms import (
    MAX_ROWS,
    composed,
    composed_int16,
    library,
    linear_int16_cpu,
    linear_two_terms_c,
    linear_two_terms_cpu,
)
from salon.kernels.linear_two_terms import linear_int16_ref, linear_two_terms_ref
from salon.kernels.w8a8_grouped import GROUP

needs_kernel = pytest.mark.skipif(library() is None, reason="needs x86-64 with AVX2 and cc")
# Each build this CPU runs (the engine runs the first).
ISAS = [isa for isa in native.cpu_isas() if library(isa) is not None]
EPS = 1e-6
# recipe -> (its reference, the CPU family's op)
RECIPES = {"two_terms": (linear_two_terms_ref, linear_two_terms_cpu), "int16": (linear_int16_ref, linear_int16_cpu)}


def _case(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g).mul(30).add(0.01)
    w_q = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    w_scale = torch.randn(n, k // GROUP, generator=g) * torch.rand(n, k // GROUP, generator=g).add(0.01) / 100
    norm = torch.rand(k, generator=g) * 2
    post = torch.rand(n, generator=g) * 2
    residual = torch.randn(m, n, generator=g) * 5
    return x, w_q, w_scale, norm, post, residual


def _options(norm, post, residual):
    for use_norm, use_post, use_res in itertools.product((False, True), repeat=3):
        yield dict(
            norm_weight=norm if use_norm else None,
            eps=EPS,
            post_norm=post if use_post else None,
            residual=residual if use_res else None,
        )


@needs_kernel
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "m,n,k",
    [
        (1, 1152, 640),
        (2, 640, 2048),
        (3, 17, 64),
        (1, 1, 32),
        (8, 4096, 640),
        (9, 33, 96),
        (16, 640, 640),
        (17, 200, 640),
        # the last row count whose two-term GEMM sums its terms as it stores them (SUM2_MAX_ROWS), the first not
        (32, 300, 64),
        (33, 300, 64),
        (MAX_ROWS, 48, 128),
        # outputs summed on all the threads (SUM_TERMS_PARALLEL_FLOATS), a short last
        # chunk of columns (SUM_TERMS_CHUNK), one chunk a row
        (17, 4100, 64),
        (MAX_ROWS, 1100, 32),
    ],
)
def test_one_call_equals_the_reference_bit_for_bit(m, n, k, isa, recipe):
    ref, cpu = RECIPES[recipe]
    x, w_q, w_scale, norm, post, residual = _case(m, n, k, seed=m * 1000 + n + k)
    for opts in _options(norm, post, residual):
        got = linear_two_terms_c(x, w_q, w_scale, **opts, isa=isa, recipe=recipe)
        assert got is not None, "the C call declined a call it should take"
        want = ref(x, w_q, w_scale, **opts)
        assert torch.equal(got, want), {key: v is not None for key, v in opts.items()}
        assert torch.equal(cpu(x, w_q, w_scale, **opts), want)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_int16_group_sums_above_2_to_the_24_round_as_the_reference(isa):
    """Rows at full scale against weights of +-127: each group's int16 sum (up to 32 * 32767 * 127) is above
    2^24, so its float conversion rounds; the composition and the one call round it as the reference does."""
    g = torch.Generator().manual_seed(21)
    x = torch.full((3, 96), 7.0)
    x[1] = -7.0
    x[2, ::2] = 7.0 - 1e-3  # odd quotients: 32762 and 32767
    w_q = torch.full((40, 96), 127, dtype=torch.int8)
    w_q[::3] = -127
    w_q[:, 5] = 126
    w_scale = torch.rand(40, 3, generator=g) / 100 + 1e-4
    want = linear_int16_ref(x, w_q, w_scale)
    assert torch.equal(linear_two_terms_c(x, w_q, w_scale, isa=isa, recipe="int16"), want)
    assert torch.equal(composed_int16(x, w_q, w_scale), want)
    acc = int(torch.round(x[2] / (7.0 / 32767)).long() @ w_q[0].long()[:96])
    assert abs(acc) > 1 << 24


@needs_kernel
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("isa", ISAS)
def test_rows_are_read_where_they_lie_and_do_not_depend_on_the_batch(isa, recipe):
    ref, _ = RECIPES[recipe]
    x, w_q, w_scale, norm, post, residual = _case(5, 96, 640, seed=3)
    wide = torch.zeros(5, 700)
    wide[:, 30:670] = x
    strided_x = wide[:, 30:670]
    wide_res = torch.zeros(5, 128)
    wide_res[:, 16:112] = residual
    strided_res = wide_res[:, 16:112]
    opts = dict(norm_weight=norm, eps=EPS, post_norm=post)
    whole = linear_two_terms_c(strided_x, w_q, w_scale, residual=strided_res, **opts, isa=isa, recipe=recipe)
    assert torch.equal(whole, ref(x, w_q, w_scale, residual=residual, **opts))
    for i in range(5):  # each row alone gives the bits it had in the batch
        row = linear_two_terms_c(
            x[i : i + 1], w_q, w_scale, residual=residual[i : i + 1], **opts, isa=isa, recipe=recipe
        )
        assert torch.equal(row, whole[i : i + 1])


@needs_kernel
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_terms_summed_over_threads_read_strided_residuals_and_keep_the_bits(isa, threads, recipe):
    ref, _ = RECIPES[recipe]
    x, w_q, w_scale, norm, post, residual = _case(19, 8200, 32, seed=11)
    wide_res = torch.zeros(19, 8300)
    wide_res[:, 50:8250] = residual
    want = ref(x, w_q, w_scale, norm_weight=norm, eps=EPS, residual=residual)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = linear_two_terms_c(
            x, w_q, w_scale, norm_weight=norm, eps=EPS, residual=wide_res[:, 50:8250], isa=isa, recipe=recipe
        )
        plain = linear_two_terms_c(x, w_q, w_scale, isa=isa, recipe=recipe)
        # 19 rows (>= ROWS_PARALLEL): the norm, the terms and the post-norm's rows split over the threads, each
        # with its own scratch row
        normed = linear_two_terms_c(
            x,
            w_q,
            w_scale,
            norm_weight=norm,
            eps=EPS,
            post_norm=post,
            residual=wide_res[:, 50:8250],
            isa=isa,
            recipe=recipe,
        )
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got, want)
    assert torch.equal(plain, ref(x, w_q, w_scale))
    assert torch.equal(normed, ref(x, w_q, w_scale, norm_weight=norm, eps=EPS, post_norm=post, residual=residual))


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_outputs_above_the_kept_scratch_size_keep_the_bits_on_every_call_and_thread(isa):
    # 2 terms x 33 rows x 262,144 columns of float32 is 69 MB, above KEPT_SCRATCH_BYTES: the thread's kept
    # buffer, then grown for 36 rows, then reused for 33 again; another thread has its own. (Up to SUM2_MAX_ROWS
    # rows the VNNI GEMM sums the terms itself and needs no buffer.)
    n, k = 262_144, 32
    _, w_q, w_scale, _, _, _ = _case(1, n, k, seed=13)
    g = torch.Generator().manual_seed(14)
    calls = [torch.randn(m, k, generator=g) * 4 for m in (33, 36, 33)]
    for x in calls:
        assert torch.equal(linear_two_terms_c(x, w_q, w_scale, isa=isa), linear_two_terms_ref(x, w_q, w_scale))
    other: list[torch.Tensor] = []
    worker = threading.Thread(target=lambda: other.append(linear_two_terms_c(calls[1], w_q, w_scale, isa=isa)))
    worker.start()
    worker.join()
    assert torch.equal(other[0], linear_two_terms_ref(calls[1], w_q, w_scale))


@needs_kernel
def test_declined_calls_compose_the_cpu_kernels_with_the_same_bits():
    x, w_q, w_scale, norm, post, residual = _case(MAX_ROWS + 1, 40, 64, seed=5)
    opts = dict(norm_weight=norm, eps=EPS, post_norm=post, residual=residual)
    assert linear_two_terms_c(x, w_q, w_scale, **opts) is None  # more rows than MAX_ROWS
    assert torch.equal(linear_two_terms_cpu(x, w_q, w_scale, **opts), linear_two_terms_ref(x, w_q, w_scale, **opts))
    per_row = w_scale[:, 0].contiguous()  # per-row weight scales: the per-row GEMM's contract, not this kernel's
    assert linear_two_terms_c(x[:2], w_q, per_row) is None
    assert torch.equal(linear_two_terms_cpu(x[:2], w_q, per_row), linear_two_terms_ref(x[:2], w_q, per_row))
    assert linear_two_terms_c(x[:2].double(), w_q, w_scale) is None
    assert linear_two_terms_c(x[:2], w_q, w_scale, norm_weight=norm[:32]) is None  # a norm of the wrong length
    assert linear_two_terms_c(x[:2], w_q, w_scale, residual=residual[:3]) is None  # a residual of other rows
    assert linear_two_terms_c(x[:0], w_q, w_scale) is None
    assert torch.equal(
        composed(x[:3], w_q, w_scale, **{**opts, "residual": residual[:3]}),
        linear_two_terms_ref(x[:3], w_q, w_scale, **{**opts, "residual": residual[:3]}),
    )


@needs_kernel
def test_declined_int16_calls_compose_the_cpu_kernels_with_the_same_bits():
    x, w_q, w_scale, norm, post, residual = _case(MAX_ROWS + 1, 40, 64, seed=6)
    opts = dict(norm_weight=norm, eps=EPS, post_norm=post, residual=residual)
    assert linear_two_terms_c(x, w_q, w_scale, **opts, recipe="int16") is None  # more rows than MAX_ROWS
    assert torch.equal(linear_int16_cpu(x, w_q, w_scale, **opts), linear_int16_ref(x, w_q, w_scale, **opts))
    assert linear_two_terms_c(x[:2], w_q, w_scale[:, 0].contiguous(), recipe="int16") is None  # per-row scales
    with pytest.raises(ValueError, match="w_scale"):  # the int16 contract is the grouped one
        linear_int16_cpu(x[:2], w_q, w_scale[:, 0].contiguous())
