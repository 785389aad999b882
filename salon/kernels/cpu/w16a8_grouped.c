/* Group-scaled GEMM of int16 activations and int8 weights on AVX2 CPUs, bit-identical to
 * salon.kernels.w16a8_grouped.w16a8_grouped_ref:
 *
 *   acc_g[m, n] = sum_{k in [32g, 32g + 32)} a[m, k] * w[n, k]     (exact, int32: |acc_g| <= 32 * 32768 * 128)
 *   y = 0;  for g = 0 .. G-1:  y = y + float(acc_g) * w_scale[n, g]  (float() rounds to nearest even above 2^24;
 *                                                                     the product rounded, then the sum)
 *   out[m, n] = y * a_scale[m]
 *
 * No fused multiply-add: the shared build flags carry -mfma, and GCC contracts _mm256_mul_ps followed by
 * _mm256_add_ps into one vfmadd (one rounding fewer, other bits) unless fp-contract is off, as it is for this
 * whole file (the pragma below, which also covers w8a8_grouped.c where a file includes both).
 *
 * Layouts: a int16[M, K] (row stride lda in int16 elements, columns contiguous), w int8[N, K] contiguous,
 * w_scale float32[N, G] contiguous, G = K / 32, out float32[M, N] (row stride ldo): the layouts of
 * w8a8_grouped.c with int16 activations, the weights and scales read as they lie. Weight rows go in blocks of 8
 * (the last block may be short: its missing rows alias the block's first row and are never stored); a block's
 * 8 x G scales are read 8 groups at a time and transposed in registers, so a group's 8 scales are one vector.
 *
 * The products are exact: weights sign-extended to int16 (vpmovsxbw) meet the activations in vpmaddwd, 16
 * products an instruction summed in pairs into int32 lanes (|pair| <= 2 * 32768 * 128 < 2^31), the pairs added
 * in int32 (|acc_g| < 2^28). A block's group (8 rows x 32 channels) is laid out in one of two ways, so that a
 * group's sums come out as one vector of the 8 rows:
 *
 *   transposed (M > W16_PAIRS_MAX_M): a transpose of 16-bit units (channel pairs) puts channels 2j, 2j + 1 of
 *     row r in 32-bit lane r of vector j, so each vector meets a broadcast of the same activation pair
 *     (vpbroadcastd from memory: a load, no shuffle) and the 16 products add up to the 8 rows' sums with no
 *     horizontal step: 32 shuffles and 16 sign extensions per group, then per activation row 16 vpmaddwd and
 *     16 vpaddd;
 *   pairs (M <= W16_PAIRS_MAX_M): rows r and r + 4 side by side, 8 channels of each in a 128-bit lane
 *     (vpunpck{l,h}qdq of both rows' 16 bytes, then vpmovsxbw), meet a vbroadcasti128 of the activations' 8
 *     channels; two in-lane transpose-and-add steps reduce the 4 row pairs to the 8 rows' sums: 8 shuffles and
 *     16 sign extensions per group, 6 shuffles more per activation row.
 *
 * Either way the sums are the exact acc_g, converted, scaled by the group's 8 scales and added to the rows'
 * float accumulators, group after group in order.
 *
 * Each thread streams its own contiguous range of weight blocks (the blocks split evenly over the threads),
 * prefetching its next block while it reads one. A group's weights are set up in two halves (16 channels, or 4
 * rows in the pair layout), each staying in registers while it meets the activation rows, W16_M_CHUNK at a time:
 * at decode sizes (one pass) every weight and scale byte is read from memory once per call and the activation
 * rows stay in L1. At prefill sizes the thread's blocks go W16_SUPER_BLOCKS at a time: the first chunk of rows
 * meets them as they come from memory (prefetching), the further chunks meet them from L2.
 *
 * For the transposed layout the activation rows are first copied group-major (int16[G, M, 32]: a group's 32
 * channels of all the rows, one after the other), so a chunk's rows of a group are one contiguous run of 4 KB
 * that the hardware prefetchers stream from L2, whatever the row stride (in place, rows 1280 to 4096 bytes apart
 * are touched one line each per group, and at K = 1024 or 2048 they alias in a few of L1's sets). Same values,
 * so same bits; without memory for the copy the call computes nothing and returns 1.
 *
 * Every output element sees the same operations in the same order whatever M, the layout, the chunking, the
 * copy or the thread split: a row's result never depends on the batch it sits in.
 *
 * Not one source with w8a8_grouped.c: the same block split, prefetch, scale transpose and scaled store
 * (grouped_blocks.h), but other products (int16 activations against sign-extended weights in vpmaddwd, not
 * bytes through vpsignb and vpmaddubsw), other layouts of a block's group (rows r and r + 4 side by side; a
 * transpose of channel pairs over the whole group) and another copy of the rows (group-major): that file's
 * header says why each layout is what it is.
 *
 * Helpers are static and prefixed w16_ / W16_: the file is included after w8a8_grouped.c into one translation
 * unit (decoder_block_avx2.c, linear_two_terms_avx2.c) as well as built alone.
 */
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grouped_blocks.h"

#define W16_BLOCK_ROWS 8
/* The pair layout for M up to this many rows (the loops over rows unrolled), the transposed one above (measured:
   the pair layout as fast or faster up to 8 rows; from 12, where its rows read in place alias in L1 at K = 2048,
   the transposed one with its dearer setup per group and its copy of the rows). */
#define W16_PAIRS_MAX_M 8
/* Activation rows a block meets per pass over its weights; their accumulators (2 x 2 KB) stay in L1. */
#define W16_M_CHUNK 64
/* Weight blocks a thread's chunks of rows meet before its next ones, when there is more than one chunk. */
#define W16_SUPER_BLOCKS 16

/* The pair layout's half h (row pairs (2h, 2h + 4) and (2h + 1, 2h + 5)) of the group at channel k: x[4q + o]
   = [row 2h + q | row 2h + q + 4], channels k + 8o .. k + 8o + 7 of each, sign-extended. */
static inline __attribute__((always_inline)) void w16_pair_weights(__m256i *x, const int8_t *const *wrow, int h,
                                                                   int64_t k) {
    for (int q = 0; q < 2; q++) {
        const int8_t *r0 = wrow[2 * h + q] + k, *r1 = wrow[2 * h + q + 4] + k;
        for (int c = 0; c < 2; c++) {
            const __m128i lo = _mm_loadu_si128((const __m128i *)(r0 + 16 * c));
            const __m128i hi = _mm_loadu_si128((const __m128i *)(r1 + 16 * c));
            x[4 * q + 2 * c] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi64(lo, hi));
            x[4 * q + 2 * c + 1] = _mm256_cvtepi8_epi16(_mm_unpackhi_epi64(lo, hi));
        }
    }
}

/* One activation row's 32 channels am against w16_pair_weights' half: [row 2h, 2h + 1, 2h, 2h + 1 | the same
   rows + 4], each the sum of two of the row's four partial sums (the other two in the other copy). */
static inline __attribute__((always_inline)) __m256i w16_pair_sums(const int16_t *am, const __m256i *x) {
    __m256i s[2];
    for (int q = 0; q < 2; q++) {
        __m256i p[4];
        for (int o = 0; o < 4; o++)
            p[o] = _mm256_madd_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(am + 8 * o))),
                                     x[4 * q + o]);
        s[q] = _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
    }
    return _mm256_add_epi32(_mm256_unpacklo_epi32(s[0], s[1]), _mm256_unpackhi_epi32(s[0], s[1]));
}

/* The transposed layout of the group at channel k: t[j] lane r = channels k + 2j, k + 2j + 1 of row r (bytes),
   in the low 128 bits, and channels k + 16 + 2j, k + 17 + 2j in the high 128 bits. */
static inline __attribute__((always_inline)) void w16_transpose_group(__m256i *t, const int8_t *const *wrow,
                                                                      int64_t k) {
    __m256i x[8], a[8], b[8];
    for (int r = 0; r < 8; r++) x[r] = _mm256_loadu_si256((const __m256i *)(wrow[r] + k));
    for (int r = 0; r < 8; r += 2) {
        a[r] = _mm256_unpacklo_epi16(x[r], x[r + 1]);     /* rows r, r + 1: units 0-3 */
        a[r + 1] = _mm256_unpackhi_epi16(x[r], x[r + 1]); /* units 4-7 */
    }
    for (int h = 0; h < 2; h++) { /* rows 4h .. 4h + 3 */
        b[4 * h] = _mm256_unpacklo_epi32(a[4 * h], a[4 * h + 2]);         /* units 0, 1 */
        b[4 * h + 1] = _mm256_unpackhi_epi32(a[4 * h], a[4 * h + 2]);     /* units 2, 3 */
        b[4 * h + 2] = _mm256_unpacklo_epi32(a[4 * h + 1], a[4 * h + 3]); /* units 4, 5 */
        b[4 * h + 3] = _mm256_unpackhi_epi32(a[4 * h + 1], a[4 * h + 3]); /* units 6, 7 */
    }
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi64(b[i], b[i + 4]);
        t[2 * i + 1] = _mm256_unpackhi_epi64(b[i], b[i + 4]);
    }
}

/* acc + the exact products of activation channels am[0 .. 15] with the half x (x[j] lane r: row r's channels
   2j, 2j + 1, sign-extended). */
static inline __attribute__((always_inline)) __m256i w16_half_sums(__m256i acc, const int16_t *am,
                                                                   const __m256i *x) {
    for (int j = 0; j < 8; j++) {
        int32_t pair;
        memcpy(&pair, am + 2 * j, sizeof pair);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_set1_epi32(pair), x[j]));
    }
    return acc;
}

/* Rows [n, n + nr) of out (nr <= 8) for activation rows [0, mc) of a (mc <= W16_M_CHUNK), in the pair layout
   (pairs: mc <= W16_PAIRS_MAX_M a compile-time constant, so the loops over rows unroll) or the transposed one.
   Row m's channels of group g are a[m * rs + g * gs + 0 .. 31] (rows in place: rs = lda, gs = 32; the
   group-major copy: rs = 32, gs = 32 * M). pf_w, pf_s: the next block's weights and scales, prefetched while
   this one is read (NULL: none). */
static inline __attribute__((always_inline)) void w16_block_tile(const int pairs, const int64_t mc,
                                                                 const int16_t *a, int64_t rs, int64_t gs,
                                                                 const int8_t *w,
                                                                 const float *w_scale, float *out, int64_t ldo,
                                                                 const float *a_scale, int64_t K, int64_t n, int nr,
                                                                 const int8_t *pf_w, const float *pf_s) {
    const int64_t G = K / GROUP;
    const int8_t *wrow[8];
    const float *srow[8];
    grouped_rows(wrow, srow, W16_BLOCK_ROWS, n, nr, w, w_scale, K, G);
    __m256 y[W16_M_CHUNK];
    __m256i part[W16_M_CHUNK]; /* a group's first half */
    for (int64_t m = 0; m < mc; m++) y[m] = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
        const int64_t ng = G - g0 < 8 ? G - g0 : 8;
        __m256 sc[8];
        grouped_load_scales(sc, srow, g0, ng);
        if (pf_s) grouped_prefetch_scales(pf_s, W16_BLOCK_ROWS, g0, G);
        for (int64_t j = 0; j < ng; j++) {
            const int64_t k = (g0 + j) * GROUP;
            if (pf_w) grouped_prefetch_weights(pf_w, W16_BLOCK_ROWS, g0 + j);
            const __m256 s = sc[j];
            const int16_t *ag = a + (g0 + j) * gs;
            __m256i x[8];
            if (pairs) {
                w16_pair_weights(x, wrow, 0, k);
                for (int64_t m = 0; m < mc; m++) part[m] = w16_pair_sums(ag + m * rs, x);
                w16_pair_weights(x, wrow, 1, k);
                for (int64_t m = 0; m < mc; m++) {
                    const __m256i h1 = w16_pair_sums(ag + m * rs, x);
                    /* [rows 0, 1, 0, 1 | 4, 5, 4, 5] and [2, 3, 2, 3 | 6, 7, 6, 7] -> [rows 0-3 | rows 4-7] */
                    const __m256i acc = _mm256_add_epi32(_mm256_unpacklo_epi64(part[m], h1),
                                                         _mm256_unpackhi_epi64(part[m], h1));
                    y[m] = _mm256_add_ps(y[m], _mm256_mul_ps(_mm256_cvtepi32_ps(acc), s));
                }
            } else {
                __m256i t[8];
                w16_transpose_group(t, wrow, k);
                for (int i = 0; i < 8; i++) x[i] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(t[i]));
                for (int64_t m = 0; m < mc; m++) part[m] = w16_half_sums(_mm256_setzero_si256(), ag + m * rs, x);
                for (int i = 0; i < 8; i++) x[i] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(t[i], 1));
                for (int64_t m = 0; m < mc; m++) {
                    const __m256i acc = w16_half_sums(part[m], ag + m * rs + 16, x);
                    y[m] = _mm256_add_ps(y[m], _mm256_mul_ps(_mm256_cvtepi32_ps(acc), s));
                }
            }
        }
    }
    grouped_store_rows(y, mc, a_scale, out, ldo, n, nr);
}

#define W16_PAIRS_CASE(MM)                                                                                   \
    case MM:                                                                                                 \
        w16_block_tile(1, MM, a, lda, GROUP, w, w_scale, out, ldo, a_scale, K, blk.n, blk.nr, blk.pf_w, blk.pf_s);  \
        break;

/* Rows [m0, m0 + mc) against the thread's blocks [s0, s1) of [.., b1): with the prefetches on the first pass
   (m0 = 0) only, a separate copy of the loop each. */
static inline __attribute__((always_inline)) void w16_chunk_pass(const int16_t *a, int64_t rs, int64_t gs,
                                                                 const int8_t *w,
                                                                 const float *w_scale, float *out, int64_t ldo,
                                                                 const float *a_scale, int64_t M, int64_t N,
                                                                 int64_t K, int64_t m0, int64_t s0, int64_t s1,
                                                                 int64_t b1) {
    const int64_t G = K / GROUP, mc = M - m0 < W16_M_CHUNK ? M - m0 : W16_M_CHUNK;
    for (int64_t b = s0; b < s1; b++) {
        const grouped_block blk = grouped_block_at(b, b1, W16_BLOCK_ROWS, N, K, G, w, w_scale);
        if (m0 == 0)
            w16_block_tile(0, mc, a, rs, gs, w, w_scale, out, ldo, a_scale, K, blk.n, blk.nr, blk.pf_w, blk.pf_s);
        else
            w16_block_tile(0, mc, a + m0 * rs, rs, gs, w, w_scale, out + m0 * ldo, ldo, a_scale + m0, K, blk.n,
                           blk.nr, NULL, NULL);
    }
}

/* The transposed layout's rows against this thread's blocks [b0, b1), W16_SUPER_BLOCKS at a time. Not inlined,
   so the pair layout's loop compiles as it does alone. */
static __attribute__((noinline)) void w16_transposed_blocks(const int16_t *a, int64_t rs, int64_t gs,
                                                            const int8_t *w,
                                                            const float *w_scale, float *out, int64_t ldo,
                                                            const float *a_scale, int64_t M, int64_t N, int64_t K,
                                                            int64_t b0, int64_t b1) {
    for (int64_t s0 = b0; s0 < b1; s0 += W16_SUPER_BLOCKS) {
        const int64_t s1 = s0 + W16_SUPER_BLOCKS < b1 ? s0 + W16_SUPER_BLOCKS : b1;
        for (int64_t m0 = 0; m0 < M; m0 += W16_M_CHUNK)
            w16_chunk_pass(a, rs, gs, w, w_scale, out, ldo, a_scale, M, N, K, m0, s0, s1, b1);
    }
}

/* Returns 0 when done, 1 when nothing was computed (M < 1, N < 1, K not a positive multiple of 32, no memory for
   the transposed layout's copy of the rows). */
int w16a8_grouped_avx2(const int16_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out,
                       int64_t ldo, const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads) {
    if (M < 1 || N < 1 || K < GROUP || K % GROUP) return 1;
    /* the transposed layout reads a group-major copy of the rows */
    int64_t rs = lda, gs = GROUP;
    int16_t *copy = NULL;
    if (M > W16_PAIRS_MAX_M) {
        copy = malloc((size_t)(M * K) * sizeof(int16_t));
        if (!copy) return 1;
        const int64_t G = K / GROUP;
        for (int64_t m = 0; m < M; m++)
            for (int64_t g = 0; g < G; g++)
                memcpy(copy + (g * M + m) * GROUP, a + m * lda + g * GROUP, GROUP * sizeof(int16_t));
        a = copy;
        rs = GROUP;
        gs = M * GROUP;
    }
    const int64_t nb = (N + W16_BLOCK_ROWS - 1) / W16_BLOCK_ROWS, G = K / GROUP;
    #pragma omp parallel num_threads(nthreads)
    {
        int64_t b0, b1;
        grouped_thread_blocks(nb, &b0, &b1);
        if (M > W16_PAIRS_MAX_M) {
            w16_transposed_blocks(a, rs, gs, w, w_scale, out, ldo, a_scale, M, N, K, b0, b1);
        } else {
            for (int64_t b = b0; b < b1; b++) {
                const grouped_block blk = grouped_block_at(b, b1, W16_BLOCK_ROWS, N, K, G, w, w_scale);
                switch (M) {
                    W16_PAIRS_CASE(1) W16_PAIRS_CASE(2) W16_PAIRS_CASE(3) W16_PAIRS_CASE(4)
                    W16_PAIRS_CASE(5) W16_PAIRS_CASE(6) W16_PAIRS_CASE(7) W16_PAIRS_CASE(8)
                }
            }
        }
    }
    free(copy);
    return 0;
}
