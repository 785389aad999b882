/* Group-scaled W8A8 GEMM on AVX-512 VNNI CPUs, bit-identical to salon.kernels.w8a8_grouped.w8a8_grouped_scaled_ref
 * (and to the AVX2 kernel of w8a8_grouped.c):
 *
 *   acc_g[m, n] = sum_{k in [32g, 32g + 32)} a[m, k] * w[n, k]                   (exact, int32)
 *   y = 0;  for g = 0 .. G-1:  y = y + float(acc_g) * w_scale[n, g]   (the product rounded, then the sum)
 *   out[m, n] = y * a_scale[m]
 *
 * and, as w8a8_group32_vnni, the group32 recipe's (salon.kernels.w8a8_group32.w8a8_group32_ref), a_scale[m, g] one
 * scale per activation row and group: the same loops with a compile-time flag (A32) for the two differences,
 *
 *   y = float(acc_0) * s_0;  for g = 1 .. G-1:  y = y + float(acc_g) * s_g,   s_g = a_scale[m, g] * w_scale[n, g]
 *   out[m, n] = y
 *
 * No fused multiply-add: fp-contract is off for the whole file (the pragma below), as in w8a8_grouped.c.
 *
 * Layouts as in w8a8_grouped.c: a int8[M, K] (row stride lda), w int8[N, K] contiguous, w_scale float32[N, G]
 * contiguous (G = K / 32), out float32[M, N] (row stride ldo). Or, with w_scale NULL, the weights and scales in
 * the packed layout of w8a8_grouped_vnni_pack (below): the same bits from one sequential stream per thread.
 *
 * The products: vpdpbusd multiplies unsigned bytes of its first operand with signed bytes of its second,
 * four pairs a 32-bit lane, and adds them to the lane without saturation. The weights, XORed with 0x80, are
 * the unsigned operand (w + 128, in [0, 255]); the activations are the signed one, each 4-byte chunk
 * broadcast to all 16 lanes straight from memory. So a lane gets sum (w + 128) a = sum w a + 128 sum a, and
 * starting each group's accumulator at -128 * (the group's sum of activations), computed once per call and
 * activation row, makes it the exact acc_g (|acc_g| <= 32 * 128 * 128 < 2^24: the float conversion is exact).
 * Every int8 activation is taken, -128 included.
 *
 * Weight rows go in blocks of 16, one per 32-bit lane (a short last block's missing rows alias its first
 * row and are never stored). A group of the block (16 rows x 32 channels) is loaded as 8 vectors [row r |
 * row r + 8] and transposed 8 x 8 in 32-bit elements inside each 256-bit half (vpunpck{l,h}{dq,qdq},
 * vpermt2q), so vector i holds channels 4i .. 4i+3 of row j in lane j; its 8 vectors meet 8 broadcasts of one
 * activation row's 32 bytes and give the 16 rows' acc_g with no horizontal step. A block's scales are read
 * 8 groups at a time ([row r | row r + 8], 8 floats each) and transposed the same way, so the 16 rows' scales
 * of a group are one vector.
 *
 * Each thread streams its own contiguous range of blocks (split evenly over the threads), prefetching its
 * next block while it reads one (packed: a few groups ahead in its one stream); a group's weights stay in
 * registers while they meet the activation rows, M_CHUNK at a time (one pass at decode sizes: every weight and
 * scale byte is read from memory once per call). Every output element sees the same operations in the same order
 * whatever M, the chunking or the thread split: a row's result never depends on the batch it sits in. On CPUs with
 * AMX, calls of 64 rows or more take the groups' int32 sums from AMX tiles instead (packed_tile_amx): the same bits.
 *
 * Not one source with w8a8_grouped.c (AVX2): the contract, the thread split and the prefetch of the next block
 * are the same (grouped_blocks.h), the algorithm of a group's sums is not: vpdpbusd of unsigned weights against
 * broadcast signed activations with a per-row activation-sum correction, 16-row blocks transposed 8 x 8 inside
 * 256-bit halves, and the packed layout, where the AVX2 kernel uses vpsignb + vpmaddubsw on 8-row blocks.
 */
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "grouped_blocks.h"

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
/* AMX tiles where the compiler has them (GCC 11, Clang 12) and the system call that grants them exists. */
#if (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11) && defined(__linux__) && defined(__x86_64__)
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#endif
#define AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))
#define BLOCK_ROWS 16
/* Activation rows a group's weights meet per pass; their accumulators (4 KB) stay in L1. */
#define M_CHUNK 64
/* Activation-sum corrections kept on the stack up to this many (M x G) entries. */
#define STACK_CORRECTIONS 2048
/* Blocks in a run of the rescoring epilogue (rescore_blocks), between refreshes of a row's running maximum. */
#define RESCORE_REFRESH 16
/* The packed layout (w8a8_grouped_vnni_pack): a 64-byte header, then the 16-row blocks one after another. A
   block is a run of units, each its groups' weights (group_weights' t[0..7]: 512 bytes a group) followed by their
   16 scales: one group and float32 scales (576 bytes), or, where every scale of the matrix is a float16
   exactly, two groups and float16 scales (1088 bytes; an odd G's last unit holds one group and 32 bytes of
   padding). So the scales arrive in the one stream with their weights (kept apart at the block's end, they cost
   a stall per block, measured by `python -m bench.gemv --grouped`). The packed tile prefetches ahead in its
   stream. At decode sizes (up to 16 rows) into L2 about 16 groups ahead and into L1 2 groups ahead: with 4 to
   16 rows a group's products take long enough that prefetches into L1 a few groups ahead arrive late, and the
   stream stalls while the core computes (measured by `python -m bench.gemv --quick --grouped`, its
   vnni_prefill_prefetch pairs: the decode distances win from 4 rows and tie at 2). At prefill sizes into L1 4
   groups ahead (without any prefetch, the packed layout lost to the rows' one from 12 rows on). */
#define PACKED_MAGIC 0x31494e4e56534c53LL /* "SLSVNNI1" */
#define PACKED_HEADER_BYTES 64
#define PACKED_WEIGHT_BYTES (8 * 64)
#define PACKED_PREFETCH_L2 (16 * PACKED_WEIGHT_BYTES)
#define PACKED_PREFETCH_L1 (2 * PACKED_WEIGHT_BYTES)
#define PACKED_PREFETCH_PREFILL (4 * PACKED_WEIGHT_BYTES)
/* bench/w8a8_grouped_vnni_prefill_prefetch.c builds this file with 0: the prefill's prefetch at every size (the
   baseline of bench.gemv's vnni_prefill_prefetch pairs). */
#ifndef DECODE_PREFETCH
#define DECODE_PREFETCH 1
#endif

typedef struct {
    int64_t magic, scale_bytes, n, k;
} packed_header;

/* Where group g of a packed block of G groups lies: its weights' and its scales' offsets in the block. */
static inline __attribute__((always_inline)) void packed_group_at(int64_t g, int64_t G, int scale_bytes,
                                                                  int64_t *w_off, int64_t *s_off) {
    const int64_t U = scale_bytes == 4 ? 1 : 2, u = g / U, j = g % U, ng = G - u * U < U ? G - u * U : U;
    const int64_t base = u * U * (PACKED_WEIGHT_BYTES + BLOCK_ROWS * scale_bytes);
    *w_off = base + j * PACKED_WEIGHT_BYTES;
    *s_off = base + ng * PACKED_WEIGHT_BYTES + j * BLOCK_ROWS * scale_bytes;
}

/* Bytes of one packed block of G groups with scales of scale_bytes (4 or 2) each. */
static inline int64_t packed_block_bytes(int64_t G, int64_t scale_bytes) {
    return (G * (PACKED_WEIGHT_BYTES + BLOCK_ROWS * scale_bytes) + 63) / 64 * 64;
}

/* 4 activation bytes read as one int32 wherever they lie, so each broadcast is vpdpbusd's memory operand. */
typedef int32_t __attribute__((aligned(1), may_alias)) unaligned_i32;

/* v[0..7] -> their 8 x 8 transpose in 32-bit elements inside each 256-bit half: v[c] half h lane r = v[r] half
   h lane c, before. */
VNNI static inline __attribute__((always_inline)) void transpose8_halves(__m512i *v) {
    const __m512i a0 = _mm512_unpacklo_epi32(v[0], v[1]), a1 = _mm512_unpackhi_epi32(v[0], v[1]);
    const __m512i a2 = _mm512_unpacklo_epi32(v[2], v[3]), a3 = _mm512_unpackhi_epi32(v[2], v[3]);
    const __m512i a4 = _mm512_unpacklo_epi32(v[4], v[5]), a5 = _mm512_unpackhi_epi32(v[4], v[5]);
    const __m512i a6 = _mm512_unpacklo_epi32(v[6], v[7]), a7 = _mm512_unpackhi_epi32(v[6], v[7]);
    /* per 128-bit lane: b0 = column 0 of rows 0-3 (lanes 0, 2) / column 4 (lanes 1, 3), b1 = columns 1 / 5, ... */
    const __m512i b0 = _mm512_unpacklo_epi64(a0, a2), b1 = _mm512_unpackhi_epi64(a0, a2);
    const __m512i b2 = _mm512_unpacklo_epi64(a1, a3), b3 = _mm512_unpackhi_epi64(a1, a3);
    const __m512i b4 = _mm512_unpacklo_epi64(a4, a6), b5 = _mm512_unpackhi_epi64(a4, a6);
    const __m512i b6 = _mm512_unpacklo_epi64(a5, a7), b7 = _mm512_unpackhi_epi64(a5, a7);
    /* columns 0-3: the even 128-bit lanes of b (rows 0-3) and of b + 4 (rows 4-7); columns 4-7: the odd ones */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    v[0] = _mm512_permutex2var_epi64(b0, lo, b4);
    v[1] = _mm512_permutex2var_epi64(b1, lo, b5);
    v[2] = _mm512_permutex2var_epi64(b2, lo, b6);
    v[3] = _mm512_permutex2var_epi64(b3, lo, b7);
    v[4] = _mm512_permutex2var_epi64(b0, hi, b4);
    v[5] = _mm512_permutex2var_epi64(b1, hi, b5);
    v[6] = _mm512_permutex2var_epi64(b2, hi, b6);
    v[7] = _mm512_permutex2var_epi64(b3, hi, b7);
}

/* t[i] lane r = bytes k + 4i .. k + 4i + 3 of row r of the block, XORed with 0x80 (unsigned w + 128). */
VNNI static inline __attribute__((always_inline)) void group_weights(__m512i *t, const int8_t *const *wrow,
                                                                     int64_t k) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int r = 0; r < 8; r++)
        t[r] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(wrow[r] + k))),
                                  _mm256_loadu_si256((const __m256i *)(wrow[r + 8] + k)), 1);
    transpose8_halves(t);
    for (int i = 0; i < 8; i++) t[i] = _mm512_xor_si512(t[i], flip);
}

/* sc[j] lane r = w_scale of row r of the block, group g0 + j, for j < ng (ng <= 8; zero past ng). */
VNNI static inline __attribute__((always_inline)) void group_scales(__m512 *sc, const float *const *srow, int64_t g0,
                                                                    int64_t ng) {
    const __mmask8 mask = (__mmask8)((1u << ng) - 1);
    __m512i v[8];
    for (int r = 0; r < 8; r++) {
        const __m256i lo = _mm256_castps_si256(_mm256_maskz_loadu_ps(mask, srow[r] + g0));
        const __m256i hi = _mm256_castps_si256(_mm256_maskz_loadu_ps(mask, srow[r + 8] + g0));
        v[r] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    transpose8_halves(v);
    for (int j = 0; j < 8; j++) sc[j] = _mm512_castsi512_ps(v[j]);
}

/* acc + vpdpbusd(w, the 4 bytes at p broadcast to every lane), the broadcast as the instruction's memory operand
   ({1to16}: one fused load, not a broadcast of its own, which the compiler emits for the packed tile's loop). */
VNNI static inline __attribute__((always_inline)) __m512i dpbusd_broadcast(__m512i acc, __m512i w,
                                                                          const unaligned_i32 *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
    return acc;
}

/* y[m] += float(acc_g of activation row m) * s for the mc rows, group g's 16 rows' weights in t (group_weights'
   layout) and their scales in s: two chains of vpdpbusd (exact int32 sums: any order gives the same acc_g) from
   the group's correction, then the product rounded and the sum. A32 (the group32 recipe): s times the row's
   own scale of the group, a32[m * G + g], rounded, is the factor instead. */
VNNI static inline __attribute__((always_inline)) void group_rows(const int64_t mc, const int8_t *a, int64_t lda,
                                                                  const int32_t *corr, int64_t G, int64_t g,
                                                                  const __m512i *t, __m512 s, __m512 *y,
                                                                  const int A32, const float *a32) {
    const int64_t k = g * GROUP;
    /* unrolled whole at decode sizes: y stays in registers (rolled, the compiler may swap this loop with the
       caller's loop over groups and keep y in memory) */
    #pragma GCC unroll 16
    for (int64_t m = 0; m < mc; m++) {
        const unaligned_i32 *am = (const unaligned_i32 *)(a + m * lda + k);
        __m512i c0 = _mm512_set1_epi32(corr[m * G + g]), c1 = _mm512_setzero_si512();
        for (int i = 0; i < 8; i += 2) {
            c0 = dpbusd_broadcast(c0, t[i], am + i);
            c1 = dpbusd_broadcast(c1, t[i + 1], am + i + 1);
        }
        const __m512 f = A32 ? _mm512_mul_ps(s, _mm512_set1_ps(a32[m * G + g])) : s;
        y[m] = _mm512_add_ps(y[m], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c0, c1)), f));
    }
}

/* The epilogue of a tile: where its outputs go. sum2: the rows are two int8 terms of mc / 2 activation rows (term
   one's rows, then term two's), and out gets their sum (+ residual), not each term. */
typedef struct {
    float *out;
    int64_t ldo;
    const float *residual; /* sum2 only, optional: f32 rows of stride sr added last */
    int64_t sr;
    int sum2;
    int64_t col0;          /* out's first column is weight row col0 (0, or a lone block's first row) */
    /* The rescored output projection's selection (salon.kernels.linear_rescored), A32 only, where l1 is given (with
       amax f32[N], alpha and beta f32[M]): per activation row m, t = alpha[m] * l1[v] + beta[m] * amax[v] (rescore_t);
       this thread's lo[32 m .. 32 m + 15] = each lane's max of a - t so far (its NaNs
       left out), lo[32 m + 16 .. 32 m + 31] = the row's running maximum as of the last refresh (after each run of
       up to RESCORE_REFRESH blocks: the larger of this thread's lanes' and shared[m], which every thread raises to
       its own; a lost race only leaves it lower), nan[m] = 1 where an a - t was NaN; maybe[m * nb + b] = 1 where an
       a + t of block b reached the larger of its lane's and the row's running maximum as they were then: each is an
       a - t of the row, at most the final lo, so every row whose a + t reaches the final lo is in a block marked
       maybe. rescore_blocks keeps it, over the outputs of a run of blocks once they are stored. */
    const float *l1, *amax, *alpha, *beta;
    float *lo, *shared;
    unsigned char *nan, *maybe;
    int64_t nb;
} tile_out;

/* out[m, n .. n + nr) = y[m] * a_scale[m] for the mc rows (A32: y[m], its scales applied per group). sum2 (never
   with A32): out[m] = (y[m] * a_scale[m]) + (y[h + m] * a_scale[h + m]) (+ residual[m], added last) for the h =
   mc / 2 rows: the same roundings, in the same order, as storing each term's row and summing them after
   (linear_two_terms.h's sum_terms), without the terms' rows ever reaching memory. */
VNNI static inline __attribute__((always_inline)) void store_rows(const int64_t mc, const __m512 *y, tile_out o,
                                                                  const float *a_scale, int64_t n, int nr,
                                                                  const int A32) {
    const __mmask16 keep = (__mmask16)((1u << nr) - 1);
    if (o.sum2) {
        const int64_t h = mc / 2;
        for (int64_t m = 0; m < h; m++) {
            __m512 v = _mm512_add_ps(_mm512_mul_ps(y[m], _mm512_set1_ps(a_scale[m])),
                                     _mm512_mul_ps(y[h + m], _mm512_set1_ps(a_scale[h + m])));
            if (o.residual) v = _mm512_add_ps(_mm512_maskz_loadu_ps(keep, o.residual + m * o.sr + n), v);
            _mm512_mask_storeu_ps(o.out + m * o.ldo + n - o.col0, keep, v);
        }
        return;
    }
    for (int64_t m = 0; m < mc; m++)
        _mm512_mask_storeu_ps(o.out + m * o.ldo + n - o.col0, keep,
                              A32 ? y[m] : _mm512_mul_ps(y[m], _mm512_set1_ps(a_scale[m])));
}

/* The selection's epilogue (tile_out) over blocks [b_first, b_last) of this thread, their mc rows' outputs stored
   (read back from L1): a row's state is loaded once and kept in registers over the run. vmaxps returns its second
   operand where the first is NaN, so max(d, lo) leaves NaNs out; the lanes past a short block's rows are masked. */
VNNI static __attribute__((noinline)) void rescore_blocks(const tile_out *o, const int64_t mc, int64_t b_first,
                                                           int64_t b_last, int64_t N) {
    for (int64_t m = 0; m < mc; m++) {
        float *state = o->lo + 2 * BLOCK_ROWS * m;  /* the lanes' maxima, then the row's as last refreshed */
        const float *ym = o->out + m * o->ldo - o->col0;
        const __m512 alpha = _mm512_set1_ps(o->alpha[m]), beta = _mm512_set1_ps(o->beta[m]);
        const __m512 row = _mm512_loadu_ps(state + BLOCK_ROWS);
        __m512 lo = _mm512_loadu_ps(state);
        __mmask16 nans = 0;
        for (int64_t b = b_first; b < b_last; b++) {
            const int64_t n = b * BLOCK_ROWS;
            const __mmask16 keep = N - n < BLOCK_ROWS ? (__mmask16)((1u << (N - n)) - 1) : (__mmask16)0xFFFF;
            const __m512 y = _mm512_maskz_loadu_ps(keep, ym + n);
            const __m512 t = _mm512_add_ps(_mm512_mul_ps(alpha, _mm512_maskz_loadu_ps(keep, o->l1 + n)),
                                           _mm512_mul_ps(beta, _mm512_maskz_loadu_ps(keep, o->amax + n)));
            const __m512 d = _mm512_sub_ps(y, t), u = _mm512_add_ps(y, t);
            nans |= _mm512_mask_cmp_ps_mask(keep, d, d, _CMP_UNORD_Q);
            lo = _mm512_mask_max_ps(lo, keep, d, lo);
            if (_mm512_mask_cmp_ps_mask(keep, u, _mm512_max_ps(lo, row), _CMP_GE_OQ)) o->maybe[m * o->nb + b] = 1;
        }
        if (nans) o->nan[m] = 1;
        _mm512_storeu_ps(state, lo);
        /* the row's maximum, shared with the other threads */
        float r = _mm512_reduce_max_ps(lo), seen;
        __atomic_load(o->shared + m, &seen, __ATOMIC_RELAXED);
        if (r > seen) __atomic_store(o->shared + m, &r, __ATOMIC_RELAXED);
        _mm512_storeu_ps(state + BLOCK_ROWS, _mm512_set1_ps(r > seen ? r : seen));
    }
}

/* The accumulators' start: 0, or -0 for A32, whose contract starts from the first group's product (-0 + p is p for
   every p, -0 included). */
VNNI static inline __attribute__((always_inline)) void start_rows(const int64_t mc, __m512 *y, const int A32) {
    for (int64_t m = 0; m < mc; m++) y[m] = _mm512_set1_ps(A32 ? -0.0f : 0.0f);
}

/* Rows [n, n + nr) of out (nr <= 16) for activation rows [0, mc) of a (mc <= M_CHUNK; a compile-time constant
   up to 16 rows, decode with two activation terms per sequence, so the accumulators stay in registers).
   corr: -128 x each group's activation sum, [mc, G] (row stride G). pf_w, pf_s: the next block's weights and
   scales, prefetched while this one is read (NULL: none). A32: a_scale is [mc, G] (row stride G), one scale per
   row and group (the group32 recipe), else [mc]. */
VNNI static inline __attribute__((always_inline)) void block_tile(const int64_t mc, const int8_t *a, int64_t lda,
                                                                  const int32_t *corr, const int8_t *w,
                                                                  const float *w_scale, tile_out out,
                                                                  const float *a_scale, int64_t K, int64_t n, int nr,
                                                                  const int8_t *pf_w, const float *pf_s,
                                                                  const int A32) {
    const int64_t G = K / GROUP;
    const int8_t *wrow[BLOCK_ROWS];
    const float *srow[BLOCK_ROWS];
    grouped_rows(wrow, srow, BLOCK_ROWS, n, nr, w, w_scale, K, G);
    __m512 y[M_CHUNK];
    start_rows(mc, y, A32);
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
        const int64_t ng = G - g0 < 8 ? G - g0 : 8;
        __m512 sc[8];
        group_scales(sc, srow, g0, ng);
        if (pf_s) grouped_prefetch_scales(pf_s, BLOCK_ROWS, g0, G);
        for (int64_t j = 0; j < ng; j++) {
            if (pf_w) grouped_prefetch_weights(pf_w, BLOCK_ROWS, g0 + j);
            __m512i t[8];
            group_weights(t, wrow, (g0 + j) * GROUP);
            group_rows(mc, a, lda, corr, G, g0 + j, t, sc[j], y, A32, a_scale);
        }
    }
    store_rows(mc, y, out, a_scale, n, nr, A32);
}

/* Prefetch ahead of a packed group's unit at q (its weights and scale_bytes scales) in its thread's stream: at
   decode sizes into L2 and L1 at the decode distances, else into L1 at the prefill's (PACKED_PREFETCH_*). */
static inline __attribute__((always_inline)) void packed_prefetch(const int8_t *q, const int scale_bytes,
                                                                  const int decode) {
    for (int i = 0; i < PACKED_WEIGHT_BYTES + BLOCK_ROWS * scale_bytes; i += 64) {
        if (DECODE_PREFETCH && decode) {
            _mm_prefetch((const char *)q + PACKED_PREFETCH_L2 + i, _MM_HINT_T1);
            _mm_prefetch((const char *)q + PACKED_PREFETCH_L1 + i, _MM_HINT_T0);
        } else {
            _mm_prefetch((const char *)q + PACKED_PREFETCH_PREFILL + i, _MM_HINT_T0);
        }
    }
}

/* The same for a block of the packed layout (w8a8_grouped_vnni_pack): its units read in order, each group's 16
   scales from its unit (SCALE_BYTES 4: float32; 2: float16, converted exactly) -- one stream per thread, no
   transposes, prefetched ahead into the thread's next block. */
VNNI static inline __attribute__((always_inline)) void packed_tile(const int64_t mc, const int8_t *a, int64_t lda,
                                                                   const int32_t *corr, const int8_t *pb, tile_out out,
                                                                   const float *a_scale, int64_t G,
                                                                   int64_t n, int nr, const int SCALE_BYTES,
                                                                   const int A32) {
    __m512 y[M_CHUNK];
    start_rows(mc, y, A32);
    for (int64_t g = 0; g < G; g++) {
        int64_t w_off, s_off;
        packed_group_at(g, G, SCALE_BYTES, &w_off, &s_off);
        const int8_t *q = pb + w_off;
        packed_prefetch(q, SCALE_BYTES, mc <= 16);  /* a compile-time constant at decode sizes */
        __m512i t[8];
        for (int i = 0; i < 8; i++) t[i] = _mm512_loadu_si512((const void *)(q + 64 * i));
        const __m512 s = SCALE_BYTES == 4
            ? _mm512_loadu_ps((const float *)(pb + s_off))
            : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pb + s_off)));
        group_rows(mc, a, lda, corr, G, g, t, s, y, A32, a_scale);
    }
    store_rows(mc, y, out, a_scale, n, nr, A32);
}

/* packed_tile for the header's scale size. */
VNNI static inline __attribute__((always_inline)) void packed_tile_any(const int64_t mc, const int8_t *a, int64_t lda,
                                                                       const int32_t *corr, const int8_t *pb,
                                                                       tile_out out, const float *a_scale,
                                                                       int64_t G, int64_t n, int nr,
                                                                       int64_t scale_bytes, const int A32) {
    if (scale_bytes == 2) packed_tile(mc, a, lda, corr, pb, out, a_scale, G, n, nr, 2, A32);
    else packed_tile(mc, a, lda, corr, pb, out, a_scale, G, n, nr, 4, A32);
}

/* The packed tile's products on AMX (Sapphire Rapids and later): where the CPU has AMX-INT8 and the kernel grants
   this process its tile state (arch_prctl), a call on packed weights of more than AMX_MIN_ROWS activation rows
   (not the two terms summed as they are stored, whose rows must meet in one tile) takes its groups' int32 sums
   from the tile unit instead of vpdpbusd, and only the float epilogue runs on the vector unit. A block meets the
   activation rows 16 at a time (AMX_ROWS, a tile's rows). The activations' group is an A tile of the chunk's rows
   x 32 bytes read where they lie (stride lda); the packed layout's group (8 vectors of 64 bytes: vector i, lane r
   = bytes 4i .. 4i + 3 of row r, XORed with 0x80) is already a B tile of 8 rows x 64 bytes. tdpbsud (signed A,
   unsigned B) gives each row sum a (w + 128), group_rows' two chains less the correction, which the epilogue adds
   before the conversion. So every output sees the same float operations in the same order as group_rows': the
   bits do not depend on which unit made the sums. Software-pipelined: the tile unit makes group g + 1's sums while
   the vector unit scales group g's.

   Only from 64 rows by default (AMX_MIN_ROWS): below, the tiles' loads and stores cost more than the products they
   save at decode sizes (8 rows), and a step of a few dozen rows (a long prompt's 32-token chunk beside decodes) is
   bound by more than its products, so the tiles' faster sums do not shorten it (`python -m bench.amx`, which moves
   the threshold with w8a8_grouped_vnni_amx_rows to measure below it).

   amx_state: -1 not yet asked, 0 off, 1 on. SALON_CPU_AMX=0 in the environment keeps it off; w8a8_grouped_vnni_amx
   turns it off or on (where granted) at run time, for tests and benches that compare the two. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define AMX_MIN_ROWS 63
#define AMX_ROWS 16
static int amx_state = -1;
static int64_t amx_min_rows = AMX_MIN_ROWS;
static int64_t amx_calls = 0;

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config;

static int amx_granted(void) {
    if (!HAVE_AMX) return 0;
    unsigned int a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!(d >> 24 & 1) || !(d >> 25 & 1)) return 0;  /* AMX-TILE, AMX-INT8 */
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* Whether calls of more rows than the threshold run on AMX; want 0 or 1 sets it (1 only where granted), -1 asks. */
int w8a8_grouped_vnni_amx(int want) {
    if (amx_state < 0) {
        const char *env = getenv("SALON_CPU_AMX");
        amx_state = env && strcmp(env, "0") == 0 ? 0 : amx_granted();
    }
    if (want == 0) amx_state = 0;
    else if (want == 1) amx_state = amx_granted();
    return amx_state;
}

/* Calls of more than min_rows activation rows run on AMX where it is on (AMX_MIN_ROWS unless set); the previous
   threshold is returned (min_rows < 0 only asks). */
int64_t w8a8_grouped_vnni_amx_rows(int64_t min_rows) {
    const int64_t before = amx_min_rows;
    if (min_rows >= 0) amx_min_rows = min_rows;
    return before;
}

/* The calls that have run on AMX in this library so far. */
int64_t w8a8_grouped_vnni_amx_calls(void) { return __atomic_load_n(&amx_calls, __ATOMIC_RELAXED); }

#if HAVE_AMX
/* This thread's tiles: 0-1 a full chunk's sums (16 rows of 16 int32), 2-3 its activations (16 rows of 32 bytes),
   4-5 a group's weights (8 rows of 64 bytes), 6 and 7 the same as 0 and 2 for a short chunk of `rest` rows. */
AMX static void amx_configure(int64_t rest) {
    amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = t == 2 || t == 3 || t == 7 ? GROUP : BLOCK_ROWS * 4;
        cfg.rows[t] = (uint8_t)(t < 4 ? AMX_ROWS : t < 6 ? GROUP / 4 : rest ? rest : AMX_ROWS);
    }
    _tile_loadconfig(&cfg);
}

AMX static void amx_release(void) { _tile_release(); }

/* Group GG's sums into sums[J] through C tile TC, the activations in A tile TA, the weights in B tile TB (literal
   tile numbers: the intrinsics name them in the instruction), prefetching ahead as packed_tile does. */
#define AMX_GROUP_SUMS(GG, J, TC, TA, TB)                                                                        \
    {                                                                                                            \
        int64_t w_off, s_off;                                                                                    \
        packed_group_at(GG, G, SCALE_BYTES, &w_off, &s_off);                                                     \
        const int8_t *q = pb + w_off;                                                                            \
        packed_prefetch(q, SCALE_BYTES, DECODE);                                                                 \
        _tile_zero(TC);                                                                                          \
        _tile_loadd(TA, a + (GG) * GROUP, lda);                                                                  \
        _tile_loadd(TB, q, BLOCK_ROWS * 4);                                                                      \
        _tile_dpbsud(TC, TA, TB);                                                                                \
        _tile_stored(TC, sums[J], BLOCK_ROWS * 4);                                                               \
    }

/* y[m] += float(acc_g of row m) x the factor, group_rows' operations, for the mc rows, from the group's sums. */
AMX static inline __attribute__((always_inline)) void amx_group_rows(const int64_t mc, int64_t g, int64_t G,
                                                                     const int32_t *sum, const int32_t *corr,
                                                                     const int8_t *pb, const float *a_scale,
                                                                     __m512 *y, const int SCALE_BYTES, const int A32) {
    int64_t w_off, s_off;
    packed_group_at(g, G, SCALE_BYTES, &w_off, &s_off);
    const __m512 s = SCALE_BYTES == 4 ? _mm512_loadu_ps((const float *)(pb + s_off))
                                      : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pb + s_off)));
    #pragma GCC unroll 16
    for (int64_t m = 0; m < mc; m++) {
        const __m512i c = _mm512_add_epi32(_mm512_load_si512((const void *)(sum + m * BLOCK_ROWS)),
                                           _mm512_set1_epi32(corr[m * G + g]));
        const __m512 f = A32 ? _mm512_mul_ps(s, _mm512_set1_ps(a_scale[m * G + g])) : s;
        y[m] = _mm512_add_ps(y[m], _mm512_mul_ps(_mm512_cvtepi32_ps(c), f));
    }
}

/* The groups' sums two at a time through C tiles TC0, TC1 and A tiles TA0, TA1 (B tiles 4, 5), each group's
   scaled into y while the tile unit makes the next one's. */
#define AMX_GROUPS_PIPELINED(TC0, TC1, TA0, TA1)                                                                 \
    {                                                                                                            \
        AMX_GROUP_SUMS(0, 0, TC0, TA0, 4)                                                                        \
        for (int64_t g = 0; g < G; g += 2) {                                                                     \
            if (g + 1 < G) AMX_GROUP_SUMS(g + 1, 1, TC1, TA1, 5)                                                 \
            amx_group_rows(mc, g, G, sums[0], corr, pb, a_scale, y, SCALE_BYTES, A32);                           \
            if (g + 2 < G) AMX_GROUP_SUMS(g + 2, 0, TC0, TA0, 4)                                                 \
            if (g + 1 < G) amx_group_rows(mc, g + 1, G, sums[1], corr, pb, a_scale, y, SCALE_BYTES, A32);        \
        }                                                                                                        \
    }

/* packed_tile's outputs for a chunk of mc activation rows (AMX_ROWS, or the short chunk's rest, which
   amx_configure was given) with the groups' sums from AMX tiles. DECODE: the call's rows fit one chunk (the decode
   prefetch distances). */
AMX static inline __attribute__((always_inline)) void packed_tile_amx(const int64_t mc, const int8_t *a, int64_t lda,
                                                                      const int32_t *corr, const int8_t *pb,
                                                                      tile_out out, const float *a_scale, int64_t G,
                                                                      int64_t n, int nr, const int SCALE_BYTES,
                                                                      const int A32, const int DECODE) {
    __m512 y[AMX_ROWS];
    int32_t sums[2][AMX_ROWS * BLOCK_ROWS] __attribute__((aligned(64)));
    start_rows(mc, y, A32);
    if (mc == AMX_ROWS) AMX_GROUPS_PIPELINED(0, 1, 2, 3)
    else AMX_GROUPS_PIPELINED(6, 6, 7, 7)
    store_rows(mc, y, out, a_scale, n, nr, A32);
}

/* One thread's packed blocks [b0, b1) of M activation rows on AMX tiles, 16 rows at a time (a
   short last chunk of M % 16), the selection's epilogue (to->l1, A32 only) after each run of RESCORE_REFRESH
   blocks, as grouped_vnni's loop does. */
AMX static inline __attribute__((always_inline)) void amx_blocks(int64_t b0, int64_t b1, const int8_t *a, int64_t lda,
                                                                 const int32_t *corr, const int8_t *blocks,
                                                                 int64_t bb, tile_out *to, const float *a_scale,
                                                                 int64_t M, int64_t N, int64_t G,
                                                                 const int SCALE_BYTES, const int A32) {
    int64_t run = b0;
    const int DECODE = M <= AMX_ROWS;
    for (int64_t b = b0; b < b1; b++) {
        const int64_t n = b * BLOCK_ROWS;
        const int nr = N - n < BLOCK_ROWS ? (int)(N - n) : BLOCK_ROWS;
        const int8_t *pb = blocks + b * bb;
        for (int64_t m0 = 0; m0 < M; m0 += AMX_ROWS) {
            tile_out chunk = *to;
            chunk.out = to->out + m0 * to->ldo;
            const float *as = a_scale + m0 * (A32 ? G : 1);
            if (M - m0 >= AMX_ROWS) {
                if (DECODE)
                    packed_tile_amx(AMX_ROWS, a + m0 * lda, lda, corr + m0 * G, pb, chunk, as, G, n, nr, SCALE_BYTES,
                                    A32, 1);
                else
                    packed_tile_amx(AMX_ROWS, a + m0 * lda, lda, corr + m0 * G, pb, chunk, as, G, n, nr, SCALE_BYTES,
                                    A32, 0);
            } else {
                packed_tile_amx(M - m0, a + m0 * lda, lda, corr + m0 * G, pb, chunk, as, G, n, nr, SCALE_BYTES, A32,
                                DECODE);
            }
        }
        if (A32 && to->l1 && (b + 1 - run == RESCORE_REFRESH || b + 1 == b1)) {
            rescore_blocks(to, M, run, b + 1, N);
            run = b + 1;
        }
    }
}

/* amx_blocks for the layout's scale size and the contract (A32: a_scale f32[M, G]; else f32[M]). */
AMX static __attribute__((noinline)) void amx_thread_blocks(int64_t b0, int64_t b1, const int8_t *a, int64_t lda,
                                                            const int32_t *corr, const int8_t *blocks, int64_t bb,
                                                            tile_out *to, const float *a_scale, int64_t M, int64_t N,
                                                            int64_t G, int64_t sb, int A32) {
    amx_configure(M % AMX_ROWS);
    if (sb == 2 && A32) amx_blocks(b0, b1, a, lda, corr, blocks, bb, to, a_scale, M, N, G, 2, 1);
    else if (sb == 2) amx_blocks(b0, b1, a, lda, corr, blocks, bb, to, a_scale, M, N, G, 2, 0);
    else if (A32) amx_blocks(b0, b1, a, lda, corr, blocks, bb, to, a_scale, M, N, G, 4, 1);
    else amx_blocks(b0, b1, a, lda, corr, blocks, bb, to, a_scale, M, N, G, 4, 0);
    amx_release();
}
#else
static void amx_thread_blocks(int64_t b0, int64_t b1, const int8_t *a, int64_t lda, const int32_t *corr,
                              const int8_t *blocks, int64_t bb, tile_out *to, const float *a_scale, int64_t M,
                              int64_t N, int64_t G, int64_t sb, int A32) {}  /* never called: amx_granted() is 0 */
#endif

/* corr[m * G + g] = -128 x the sum of a[m, 32g .. 32g + 31]. */
VNNI static void activation_corrections(int32_t *corr, const int8_t *a, int64_t lda, int64_t M, int64_t G) {
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < G; g++) {
            const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones,
                                                  _mm256_loadu_si256((const __m256i *)(a + m * lda + g * GROUP)));
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
            corr[m * G + g] = -128 * _mm_cvtsi128_si32(h);
        }
}

#define DECODE_CASE(MM)                                                                                     \
    case MM:                                                                                                \
        if (packed) packed_tile_any(MM, a, lda, corr, pb, to, a_scale, G, blk.n, blk.nr, sb, A32);         \
        else block_tile(MM, a, lda, corr, w, w_scale, to, a_scale, K, blk.n, blk.nr, blk.pf_w, blk.pf_s, A32); \
        break;

/* The GEMM of either contract (A32: a_scale f32[M, G], one scale per row and group; else f32[M]), into out as `o`
   says (sum2: M even and at most M_CHUNK, so both terms of a row meet in one tile). */
VNNI static inline __attribute__((always_inline)) int grouped_vnni(const int8_t *a, int64_t lda, const int8_t *w,
                                                                   const float *w_scale, const tile_out o,
                                                                   const float *a_scale, int64_t M, int64_t N,
                                                                   int64_t K, int nthreads, const int A32) {
    if (M < 1 || K < GROUP || K % GROUP) return 1;
    if (o.sum2 && (A32 || M % 2 || M > M_CHUNK)) return 1;
    if (o.l1 && (!A32 || M > M_CHUNK)) return 1;
    const int64_t nb = (N + BLOCK_ROWS - 1) / BLOCK_ROWS, G = K / GROUP;
    const int packed = w_scale == NULL;
    const packed_header *hdr = (const packed_header *)w;
    if (packed && (hdr->magic != PACKED_MAGIC || hdr->n != N || hdr->k != K
                   || (hdr->scale_bytes != 4 && hdr->scale_bytes != 2)))
        return 1;
    const int64_t sb = packed ? hdr->scale_bytes : 4, bb = packed_block_bytes(G, sb);
    const int8_t *blocks = w + PACKED_HEADER_BYTES;
    int32_t stack_corr[STACK_CORRECTIONS];
    int32_t *corr = M * G <= STACK_CORRECTIONS ? stack_corr : malloc((size_t)(M * G) * sizeof(int32_t));
    if (corr == NULL) return 1;
    activation_corrections(corr, a, lda, M, G);
    const int amx = packed && !o.sum2 && M > amx_min_rows && w8a8_grouped_vnni_amx(-1);
    if (amx) __atomic_fetch_add(&amx_calls, 1, __ATOMIC_RELAXED);
    #pragma omp parallel num_threads(nthreads)
    {
        int64_t b0, b1;
        grouped_thread_blocks(nb, &b0, &b1);
        tile_out to = o;
        if (o.l1) {  /* this thread's running maxima */
            to.lo = o.lo + (int64_t)omp_get_thread_num() * M * 2 * BLOCK_ROWS;
            to.nan = o.nan + (int64_t)omp_get_thread_num() * M;
        }
        if (amx) {
            amx_thread_blocks(b0, b1, a, lda, corr, blocks, bb, &to, a_scale, M, N, G, sb, A32);
            b1 = b0;  /* done */
        }
        int64_t run = b0;  /* the first block whose outputs the selection's epilogue has not seen */
        for (int64_t b = b0; b < b1; b++) {
            const grouped_block blk = grouped_block_at(b, b1, BLOCK_ROWS, N, K, G, w, w_scale);
            const int8_t *pb = blocks + b * bb;
            switch (M) {
                DECODE_CASE(1) DECODE_CASE(2) DECODE_CASE(3) DECODE_CASE(4)
                DECODE_CASE(5) DECODE_CASE(6) DECODE_CASE(7) DECODE_CASE(8)
                DECODE_CASE(9) DECODE_CASE(10) DECODE_CASE(11) DECODE_CASE(12)
                DECODE_CASE(13) DECODE_CASE(14) DECODE_CASE(15) DECODE_CASE(16)
                default:
                    for (int64_t m0 = 0; m0 < M; m0 += M_CHUNK) {
                        const int64_t mc = M - m0 < M_CHUNK ? M - m0 : M_CHUNK;
                        const float *as = a_scale + m0 * (A32 ? G : 1);
                        tile_out chunk = to;  /* sum2 and rescoring: one chunk (M <= M_CHUNK), m0 is 0 */
                        chunk.out = to.out + m0 * to.ldo;
                        if (packed) {
                            packed_tile_any(mc, a + m0 * lda, lda, corr + m0 * G, pb, chunk, as, G, blk.n, blk.nr,
                                            sb, A32);
                            continue;
                        }
                        block_tile(mc, a + m0 * lda, lda, corr + m0 * G, w, w_scale, chunk, as, K, blk.n, blk.nr,
                                   m0 ? NULL : blk.pf_w, m0 ? NULL : blk.pf_s, A32);
                    }
            }
            if (A32 && o.l1 && (b + 1 - run == RESCORE_REFRESH || b + 1 == b1)) {
                rescore_blocks(&to, M, run, b + 1, N);
                run = b + 1;
            }
        }
    }
    if (corr != stack_corr) free(corr);
    return 0;
}

/* Returns 0 when done, 1 when nothing was computed (M < 1, K not a positive multiple of 32, no memory).
   w_scale NULL: w is the packed layout of w8a8_grouped_vnni_pack (the scales inside it; 1 where its header is not
   one of N x K weights). */
VNNI int w8a8_grouped_vnni(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out,
                           int64_t ldo, const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads) {
    const tile_out o = {.out = out, .ldo = ldo};
    return grouped_vnni(a, lda, w, w_scale, o, a_scale, M, N, K, nthreads, 0);
}

/* The two int8 terms' GEMM summed as it is stored: a holds 2H rows (the H rows' first terms, then their second
   terms, a_scale f32[2H] likewise), out[m] = the first term's output + the second's (+ residual[m], row stride sr,
   optional), the bits of w8a8_grouped_vnni into a buffer of 2H rows, then linear_two_terms.h's sum_terms. The terms'
   rows never reach memory: for the output projection at batch 8, 16 MB written and read again saved. Returns 1
   (nothing computed) where w8a8_grouped_vnni would, and where 2H exceeds M_CHUNK. */
VNNI int w8a8_grouped_vnni_sum2(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out,
                                int64_t ldo, const float *a_scale, int64_t H, int64_t N, int64_t K,
                                const float *residual, int64_t sr, int nthreads) {
    const tile_out o = {.out = out, .ldo = ldo, .residual = residual, .sr = sr, .sum2 = 1};
    return grouped_vnni(a, lda, w, w_scale, o, a_scale, 2 * H, N, K, nthreads, 0);
}

/* The group32 recipe's GEMM (salon.kernels.w8a8_group32): the same, with a_scale f32[M, K / 32] (contiguous), one
   scale per activation row and group, multiplied into the weights' scale of the group before the group's sum. */
VNNI int w8a8_group32_vnni(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out,
                           int64_t ldo, const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads) {
    const tile_out o = {.out = out, .ldo = ldo};
    return grouped_vnni(a, lda, w, w_scale, o, a_scale, M, N, K, nthreads, 1);
}

/* t of activation row m and weight row v (store_rows computes it 16 lanes at a time, with these operations). */
static inline float rescore_t(const tile_out *o, int64_t m, int64_t v) {
    return o->alpha[m] * o->l1[v] + o->beta[m] * o->amax[v];
}

/* The rescored output projection (salon.kernels.linear_rescored) of M activation rows (2M <= M_CHUNK): the group32
   GEMM of a32 (int8[M, K], scales s32 f32[M, G]) into out f32[M, N] for every weight row, its epilogue keeping the
   selection's running maxima (tile_out); then each row's lo, the rows to rescore among the blocks marked maybe, and
   for each 16-row block holding one, the block's two-term values of a2 (int8[2M, K]: the first terms, then the
   second ones; scales s2 f32[2M]) summed as they are stored, copied over the rescored rows. factors f32[2M] (alpha,
   then beta) and bounds f32[2, N] (l1, then amax) as the contract has them; w, w_scale as w8a8_grouped_vnni takes
   them (packed with w_scale NULL). The blocks to rescore split over the threads. argmax (int64[M], or NULL): each
   row's argmax of out (its first index on ties), from the rescored rows alone: every row left at its group32 value
   is below lo, and the largest rescored value is at least lo (the contract's bound; checked, with no NaN among
   them), so the largest of out is the largest rescored one; -1 where that does not hold (the caller takes the
   argmax of out). Returns 0 when done, 1 when nothing was computed (shapes declined, no memory). */
VNNI int w8a8_group32_rescored_vnni(const int8_t *a32, const float *s32, const int8_t *a2, const float *s2,
                                    const float *factors, const int8_t *w, const float *w_scale,
                                    const float *bounds, float *out, int64_t *argmax, int64_t M, int64_t N, int64_t K,
                                    int nthreads) {
    if (M < 1 || 2 * M > M_CHUNK || K < GROUP || K % GROUP || N < 1 || nthreads < 1) return 1;
    const int64_t nb = (N + BLOCK_ROWS - 1) / BLOCK_ROWS, G = K / GROUP;
    float *lo = malloc((size_t)(M * nthreads * 2 * BLOCK_ROWS) * sizeof(float));
    unsigned char *nan = calloc((size_t)(M * nthreads), 1);
    unsigned char *maybe = calloc((size_t)(M * nb), 1);    /* [m, b], then: block b holds a row of m to rescore */
    unsigned char *blocks = calloc((size_t)nb, 1);         /* block b holds a row of some m to rescore */
    int64_t *todo = malloc((size_t)nb * sizeof(int64_t));
    int32_t *corr = malloc((size_t)(2 * M * G) * sizeof(int32_t));
    float *row_lo = malloc((size_t)M * sizeof(float));
    uint16_t *rescored = NULL;  /* [m, i]: the rows of todo[i] that took their two-term value */
    int status = 1;
    if (!lo || !nan || !maybe || !blocks || !todo || !corr || !row_lo) goto done;
    for (int64_t i = 0; i < M * nthreads * 2 * BLOCK_ROWS; i++) lo[i] = -INFINITY;
    for (int64_t m = 0; m < M; m++) row_lo[m] = -INFINITY;  /* shared by the threads while the GEMM runs */
    const tile_out o = {.out = out, .ldo = N, .l1 = bounds, .amax = bounds + N, .alpha = factors, .beta = factors + M,
                        .lo = lo, .shared = row_lo, .nan = nan, .maybe = maybe, .nb = nb};
    if (grouped_vnni(a32, K, w, w_scale, o, s32, M, N, K, nthreads, 1)) goto done;
    for (int64_t m = 0; m < M; m++) {
        int skip = 0;
        row_lo[m] = -INFINITY;
        for (int t = 0; t < nthreads; t++) {
            skip |= nan[t * M + m];
            for (int j = 0; j < BLOCK_ROWS; j++)
                if (lo[(t * M + m) * 2 * BLOCK_ROWS + j] > row_lo[m]) row_lo[m] = lo[(t * M + m) * 2 * BLOCK_ROWS + j];
        }
        if (skip) {  /* a NaN lo: nothing rescored */
            memset(maybe + m * nb, 0, (size_t)nb);
            continue;
        }
        for (int64_t b = 0; b < nb; b++) {
            if (!maybe[m * nb + b]) continue;
            int any = 0;
            for (int64_t v = b * BLOCK_ROWS; v < N && v < (b + 1) * BLOCK_ROWS; v++)
                any |= out[m * N + v] + rescore_t(&o, m, v) >= row_lo[m];
            maybe[m * nb + b] = (unsigned char)any;
            blocks[b] |= (unsigned char)any;
        }
    }
    int64_t ntodo = 0;
    for (int64_t b = 0; b < nb; b++)
        if (blocks[b]) todo[ntodo++] = b;
    if (argmax && !(rescored = calloc((size_t)(M * (ntodo ? ntodo : 1)), sizeof(uint16_t)))) goto done;
    activation_corrections(corr, a2, K, 2 * M, G);
    const packed_header *hdr = (const packed_header *)w;
    const int packed = w_scale == NULL;
    const int64_t sb = packed ? hdr->scale_bytes : 4, bb = packed_block_bytes(G, sb);
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 4) if (ntodo > 8)
    for (int64_t i = 0; i < ntodo; i++) {
        const int64_t b = todo[i], n = b * BLOCK_ROWS;
        const int nr = N - n < BLOCK_ROWS ? (int)(N - n) : BLOCK_ROWS;
        float e[M_CHUNK / 2 * BLOCK_ROWS];
        const tile_out eo = {.out = e, .ldo = BLOCK_ROWS, .sum2 = 1, .col0 = n};
        if (packed)
            packed_tile_any(2 * M, a2, K, corr, w + PACKED_HEADER_BYTES + b * bb, eo, s2, G, n, nr, sb, 0);
        else
            block_tile(2 * M, a2, K, corr, w, w_scale, eo, s2, K, n, nr, NULL, NULL, 0);
        for (int64_t m = 0; m < M; m++) {
            if (!maybe[m * nb + b]) continue;
            for (int j = 0; j < nr; j++) {
                float *a = out + m * N + n + j;
                if (*a + rescore_t(&o, m, n + j) >= row_lo[m]) {
                    *a = e[m * BLOCK_ROWS + j];
                    if (rescored) rescored[m * ntodo + i] |= (uint16_t)(1u << j);
                }
            }
        }
    }
    for (int64_t m = 0; argmax && m < M; m++) {
        int64_t best = -1;
        int ok = 1;
        for (int64_t i = 0; i < ntodo && ok; i++)  /* blocks in order, rows in order: the first of equals kept */
            for (int j = 0; j < BLOCK_ROWS; j++) {
                if (!(rescored[m * ntodo + i] >> j & 1)) continue;
                const int64_t v = todo[i] * BLOCK_ROWS + j;
                if (isnan(out[m * N + v])) ok = 0;
                else if (best < 0 || out[m * N + v] > out[m * N + best]) best = v;
            }
        argmax[m] = ok && best >= 0 && out[m * N + best] >= row_lo[m] ? best : -1;
    }
    status = 0;
done:
    free(lo);
    free(nan);
    free(maybe);
    free(blocks);
    free(todo);
    free(corr);
    free(row_lo);
    free(rescored);
    return status;
}

/* The packed layout of int8 w[N, K] and its scales f32[N, K / 32], for w8a8_grouped_vnni with w_scale NULL:
 * the header (magic, scale_bytes, N, K), then nb = ceil(N / 16) blocks of packed_block_bytes(G, scale_bytes).
 * Block b holds its units (above): for each group g, group_weights' 8 vectors for rows 16b .. 16b + 15 (vector
 * i, lane r: w[16b + r, 32g + 4i .. 32g + 4i + 3] XOR 0x80), and the 16 rows' scales of g after its unit's weights
 * (float32, or float16 with scale_bytes 2: the caller asks for it only where every scale converts exactly). The missing
 * rows of a short last block repeat its first row (computed, never stored), as block_tile's do. Returns 0 when
 * done, 1 when K is not a positive multiple of 32, N < 1 or scale_bytes is not 4 or 2. Each thread packs its own
 * blocks. */
VNNI int w8a8_grouped_vnni_pack(const int8_t *w, const float *w_scale, int64_t N, int64_t K, int64_t scale_bytes,
                                int8_t *packed, int nthreads) {
    if (N < 1 || K < GROUP || K % GROUP || (scale_bytes != 4 && scale_bytes != 2)) return 1;
    const int64_t nb = (N + BLOCK_ROWS - 1) / BLOCK_ROWS, G = K / GROUP, bb = packed_block_bytes(G, scale_bytes);
    memset(packed, 0, PACKED_HEADER_BYTES);
    const packed_header hdr = {PACKED_MAGIC, scale_bytes, N, K};
    memcpy(packed, &hdr, sizeof hdr);
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t n = b * BLOCK_ROWS;
        const int8_t *wrow[BLOCK_ROWS];
        const float *srow[BLOCK_ROWS];
        grouped_rows(wrow, srow, BLOCK_ROWS, n, N - n < BLOCK_ROWS ? (int)(N - n) : BLOCK_ROWS, w, w_scale, K, G);
        int8_t *pb = packed + PACKED_HEADER_BYTES + b * bb;
        memset(pb + bb - 64, 0, 64);  /* the padding, if any */
        for (int64_t g = 0; g < G; g++) {
            int64_t w_off, s_off;
            packed_group_at(g, G, (int)scale_bytes, &w_off, &s_off);
            __m512i t[8];
            group_weights(t, wrow, g * GROUP);
            for (int i = 0; i < 8; i++) _mm512_storeu_si512((void *)(pb + w_off + 64 * i), t[i]);
            int8_t *sq = pb + s_off;
            float s[BLOCK_ROWS];
            for (int r = 0; r < BLOCK_ROWS; r++) s[r] = srow[r][g];
            if (scale_bytes == 4)
                memcpy(sq, s, sizeof s);
            else
                _mm256_storeu_si256((__m256i *)sq, _mm512_cvtps_ph(_mm512_loadu_ps(s), _MM_FROUND_TO_NEAREST_INT));
        }
    }
    return 0;
}

/* Bytes of w8a8_grouped_vnni_pack's layout for N x K weights with scales of scale_bytes each. */
int64_t w8a8_grouped_vnni_packed_bytes(int64_t N, int64_t K, int64_t scale_bytes) {
    return PACKED_HEADER_BYTES + (N + BLOCK_ROWS - 1) / BLOCK_ROWS * packed_block_bytes(K / GROUP, scale_bytes);
}
