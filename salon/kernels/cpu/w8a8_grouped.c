/* Group-scaled W8A8 GEMM on AVX2 CPUs, bit-identical to salon.kernels.w8a8_grouped.w8a8_grouped_scaled_ref:
 *
 *   acc_g[m, n] = sum_{k in [32g, 32g + 32)} a[m, k] * w[n, k]                   (exact, int32)
 *   y = 0;  for g = 0 .. G-1:  y = y + float(acc_g) * w_scale[n, g]   (the product rounded, then the sum)
 *   out[m, n] = y * a_scale[m]
 *
 * and, as w8a8_group32_avx2, the group32 recipe's (salon.kernels.w8a8_group32.w8a8_group32_ref), a_scale[m, g] one
 * scale per activation row and group: the same loops with a compile-time flag (A32) for the two differences,
 *
 *   y = float(acc_0) * s_0;  for g = 1 .. G-1:  y = y + float(acc_g) * s_g,   s_g = a_scale[m, g] * w_scale[n, g]
 *   out[m, n] = y
 *
 * No fused multiply-add: the shared build flags carry -mfma, and GCC contracts _mm256_mul_ps followed by
 * _mm256_add_ps into one vfmadd (one rounding fewer, other bits) unless fp-contract is off, as it is for this
 * whole file (the pragma below).
 *
 * Layouts: a int8[M, K] (row stride lda, columns contiguous), w int8[N, K] contiguous, w_scale float32[N, G]
 * contiguous, G = K / 32 (the reference's own layout: no transposed copy is needed), out float32[M, N] (row
 * stride ldo). Weight rows go in blocks of 8 (the last block may be short: its missing rows alias the
 * block's first row and are never stored). A block's 8 x G scales are one contiguous run of w_scale, read 8
 * groups at a time and transposed in registers (8 x 8), so the 8 rows' scales of a group are one vector.
 *
 * The products are exact as in w8a8_gemv.c, 32 bytes at a time:
 *
 *     u = |x|  (vpabsb),  s = sign(a, x)  (vpsignb),  p = maddubs(u, s)  (int16, |p| <= 2 * 128 * 127),
 *     q = madd(p, 1)  (int32, 4 channels a lane)
 *
 * so the activations may not hold -128 (vpsignb's negation wraps): such a call computes nothing and
 * returns 1. A block's group (8 rows x 32 channels) is laid out in one of two ways, so that a group's sums
 * come out as one vector of the 8 rows:
 *
 *   transposed (M > 4): a 4 x 4 dword transpose inside each 128-bit lane of [row r | row r + 4] 16-byte
 *     loads (vpunpck{l,h}{dq,qdq}) puts 4 channels of row r in 32-bit lane r, so each of the 8 vectors meets
 *     a broadcast of the same 4 activation bytes and they add up to the 8 rows' sums with no horizontal
 *     step: dearer to set up per group (16 shuffles), cheapest per activation row;
 *   pairs (M <= 4): two rows interleaved by 64 bits (vpunpck{l,h}qdq) meet two in-lane vpshufd copies of
 *     the activations, and in-lane shuffles and one cross-lane add reduce the products to the 8 rows' sums:
 *     cheap to set up, a few more shuffles per activation row.
 *
 * Either way the sums are the exact acc_g (|acc_g| <= 32 * 127 * 128 < 2^24: the float conversion is exact),
 * scaled by the group's 8 scales and added to the rows' float accumulators, group after group in order.
 *
 * Each thread streams its own contiguous range of weight blocks (the blocks split evenly over the threads),
 * prefetching its next block while it reads one. A group's weights are set up in two halves, each staying in
 * registers while it meets the activation rows, M_CHUNK at a time: at decode sizes (one pass) every weight
 * and scale byte is read from memory once per call and the activation rows stay in L1. At prefill sizes the
 * thread's blocks go SUPER_BLOCKS at a time: the first chunk of rows meets them as they come from memory
 * (prefetching), and the further chunks meet them from cache, each chunk's rows read from cache once per super
 * block instead of streaming all M rows past every block (only the first pass carries the prefetches).
 *
 * Activation rows whose stride is a multiple of ALIAS_STRIDE bytes (K = 1024 or 2048 contiguous: Gemma's o and
 * down projections) fall in a few of L1's sets, so the rows of a chunk evict each other; for the transposed
 * layout such rows are first copied to a buffer with a stride of 64 bytes more (same values, so same bits).
 *
 * Every output element sees the same operations in the same order whatever M, the layout, the chunking, the
 * copy or the thread split: a row's result never depends on the batch it sits in.
 *
 * Not one source with w16a8_grouped.c or w8a8_grouped_vnni.c: the three share what is the same algorithm (the
 * split of the weight blocks over the threads, the prefetch of the next block, the 8-row scale transpose and the
 * scaled store: grouped_blocks.h), and differ in how a group's exact sums are made, which is not a width or a
 * type: here vpsignb + vpmaddubsw + vpmaddwd on bytes (the -128 refusal comes from vpsignb), 8-row blocks in a
 * 64-bit row interleave (M <= 4) or a 4 x 4 dword transpose per 16-channel half, rows copied where their stride
 * aliases; w16a8_grouped.c sign-extends the weights to meet int16 activations in vpmaddwd, with rows r and r + 4
 * side by side (M <= 8) or a transpose of 16-bit channel pairs over the whole group, rows copied group-major;
 * w8a8_grouped_vnni.c makes them with vpdpbusd on 16-row blocks and an activation-sum correction, with a packed
 * weight layout of its own.
 */
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grouped_blocks.h"

#define BLOCK_ROWS 8
/* Activation rows a block meets per pass over its weights; their accumulators (2 x 2 KB) stay in L1. */
#define M_CHUNK 64
/* Weight blocks a thread's chunks of rows meet before its next ones, when there is more than one chunk (16
   blocks of K = 2048 and a chunk's rows: 390 KB, within L2). */
#define SUPER_BLOCKS 16
/* Row strides that are a multiple of this many bytes are copied to a stride 64 bytes longer (M > 4). */
#define ALIAS_STRIDE 512

/* Rows 4h .. 4h+3 of the block at channel k in the pair layout: rows 4h+2p and 4h+2p+1 interleaved by 64 bits,
   x[2p] holding channels 0-7 and 16-23 of both, x[2p+1] channels 8-15 and 24-31; u = |x|. */
static inline __attribute__((always_inline)) void pair_weights(__m256i *x, __m256i *u, const int8_t *const *wrow,
                                                               int h, int64_t k) {
    for (int p = 0; p < 2; p++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wrow[4 * h + 2 * p] + k));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wrow[4 * h + 2 * p + 1] + k));
        x[2 * p] = _mm256_unpacklo_epi64(w0, w1);
        x[2 * p + 1] = _mm256_unpackhi_epi64(w0, w1);
        u[2 * p] = _mm256_abs_epi8(x[2 * p]);
        u[2 * p + 1] = _mm256_abs_epi8(x[2 * p + 1]);
    }
}

/* The 4 rows of pair_weights against the 32 activation bytes av: [rows, channels 0-15 | rows, channels 16-31]. */
static inline __attribute__((always_inline)) __m256i pair_sums(__m256i av, const __m256i *x, const __m256i *u) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i alo = _mm256_shuffle_epi32(av, 0x44), ahi = _mm256_shuffle_epi32(av, 0xEE);
    __m256i r[2]; /* [r0 r0 r1 r1 | r0 r0 r1 r1] of a row pair, 8 channels a lane */
    for (int p = 0; p < 2; p++)
        r[p] = _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_maddubs_epi16(u[2 * p], _mm256_sign_epi8(alo, x[2 * p])), ones),
            _mm256_madd_epi16(_mm256_maddubs_epi16(u[2 * p + 1], _mm256_sign_epi8(ahi, x[2 * p + 1])), ones));
    const __m256 f0 = _mm256_castsi256_ps(r[0]), f1 = _mm256_castsi256_ps(r[1]);
    return _mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(f0, f1, 0x88)),
                            _mm256_castps_si256(_mm256_shuffle_ps(f0, f1, 0xDD)));
}

/* t[i] lane r = the 4 bytes at k + 4i of row r of the block, i < 4; u = |t|. */
static inline __attribute__((always_inline)) void transpose_half(__m256i *t, __m256i *u, const int8_t *const *wrow,
                                                                 int64_t k) {
    __m256i z[4]; /* [row r bytes k .. k+15 | row r + 4 bytes k .. k+15] */
    for (int r = 0; r < 4; r++)
        z[r] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(wrow[r] + k))),
                                       _mm_loadu_si128((const __m128i *)(wrow[r + 4] + k)), 1);
    const __m256i a0 = _mm256_unpacklo_epi32(z[0], z[1]), a1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i a2 = _mm256_unpacklo_epi32(z[2], z[3]), a3 = _mm256_unpackhi_epi32(z[2], z[3]);
    t[0] = _mm256_unpacklo_epi64(a0, a2);
    t[1] = _mm256_unpackhi_epi64(a0, a2);
    t[2] = _mm256_unpacklo_epi64(a1, a3);
    t[3] = _mm256_unpackhi_epi64(a1, a3);
    for (int i = 0; i < 4; i++) u[i] = _mm256_abs_epi8(t[i]);
}

/* acc + the exact products of activation bytes am[0 .. 15] with the half transposed into t, u (lane r = row r). */
static inline __attribute__((always_inline)) __m256i half_sums(__m256i acc, const int8_t *am, const __m256i *t,
                                                               const __m256i *u) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < 4; i++) {
        int32_t chunk;
        memcpy(&chunk, am + 4 * i, sizeof chunk);
        const __m256i s = _mm256_sign_epi8(_mm256_set1_epi32(chunk), t[i]);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u[i], s), ones));
    }
    return acc;
}

/* Rows [n, n + nr) of out (nr <= 8) for activation rows [0, mc) of a (mc <= M_CHUNK), in the pair layout
   (pairs: M <= 4, mc a compile-time constant so the loops over rows unroll) or the transposed one. pf_w,
   pf_s: the next block's weights and scales, prefetched while this one is read (NULL: none). A32 (the group32
   recipe): a_scale is [mc, G] (row stride G), each group's factor the row's scale of the group times the weights'
   (rounded), the rows' sums starting from -0 (-0 + p is p, so y is the first group's product) and stored as they
   are; else a_scale is [mc], applied at the store. */
static inline __attribute__((always_inline)) void block_tile(const int pairs, const int64_t mc, const int8_t *a,
                                                             int64_t lda, const int8_t *w, const float *w_scale,
                                                             float *out, int64_t ldo, const float *a_scale,
                                                             int64_t K, int64_t n, int nr, const int8_t *pf_w,
                                                             const float *pf_s, const int A32) {
    const int64_t G = K / GROUP;
    const int8_t *wrow[8];
    const float *srow[8];
    grouped_rows(wrow, srow, BLOCK_ROWS, n, nr, w, w_scale, K, G);
    __m256 y[M_CHUNK];
    __m256i part[M_CHUNK]; /* a group's first half: rows 0-3 (pairs) or channels 0-15 (transposed) */
    for (int64_t m = 0; m < mc; m++) y[m] = _mm256_set1_ps(A32 ? -0.0f : 0.0f);
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
        const int64_t ng = G - g0 < 8 ? G - g0 : 8;
        __m256 sc[8];
        grouped_load_scales(sc, srow, g0, ng);
        if (pf_s) grouped_prefetch_scales(pf_s, BLOCK_ROWS, g0, G);
        for (int64_t j = 0; j < ng; j++) {
            const int64_t k = (g0 + j) * GROUP;
            if (pf_w) grouped_prefetch_weights(pf_w, BLOCK_ROWS, g0 + j);
            const __m256 s = sc[j];
            const int64_t g = g0 + j;
            __m256i t[4], u[4];
            if (pairs) {
                pair_weights(t, u, wrow, 0, k);
                for (int64_t m = 0; m < mc; m++)
                    part[m] = pair_sums(_mm256_loadu_si256((const __m256i *)(a + m * lda + k)), t, u);
                pair_weights(t, u, wrow, 1, k);
                for (int64_t m = 0; m < mc; m++) {
                    const __m256i h1 = pair_sums(_mm256_loadu_si256((const __m256i *)(a + m * lda + k)), t, u);
                    /* [rows 0-3 | rows 4-7], each the sum of its two channel halves */
                    const __m256i acc = _mm256_add_epi32(_mm256_blend_epi32(part[m], h1, 0xF0),
                                                         _mm256_permute2x128_si256(part[m], h1, 0x21));
                    const __m256 f = A32 ? _mm256_mul_ps(s, _mm256_set1_ps(a_scale[m * G + g])) : s;
                    y[m] = _mm256_add_ps(y[m], _mm256_mul_ps(_mm256_cvtepi32_ps(acc), f));
                }
            } else {
                transpose_half(t, u, wrow, k);
                for (int64_t m = 0; m < mc; m++) part[m] = half_sums(_mm256_setzero_si256(), a + m * lda + k, t, u);
                transpose_half(t, u, wrow, k + 16);
                for (int64_t m = 0; m < mc; m++) {
                    const __m256i acc = half_sums(part[m], a + m * lda + k + 16, t, u);
                    const __m256 f = A32 ? _mm256_mul_ps(s, _mm256_set1_ps(a_scale[m * G + g])) : s;
                    y[m] = _mm256_add_ps(y[m], _mm256_mul_ps(_mm256_cvtepi32_ps(acc), f));
                }
            }
        }
    }
    grouped_store_rows(y, mc, A32 ? NULL : a_scale, out, ldo, n, nr);
}

#define PAIRS_CASE(MM)                                                                                      \
    case MM:                                                                                                \
        block_tile(1, MM, a, lda, w, w_scale, out, ldo, a_scale, K, blk.n, blk.nr, blk.pf_w, blk.pf_s, A32); \
        break;

/* Rows [m0, m0 + mc) against the thread's blocks [s0, s1) of [.., b1): with the prefetches on the first pass
   (m0 = 0) only, a separate copy of the loop each (the prefetches' checks cost the further passes). */
static inline __attribute__((always_inline)) void chunk_pass(const int8_t *a, int64_t lda, const int8_t *w,
                                                             const float *w_scale, float *out, int64_t ldo,
                                                             const float *a_scale, int64_t M, int64_t N, int64_t K,
                                                             int64_t m0, int64_t s0, int64_t s1, int64_t b1,
                                                             const int A32) {
    const int64_t G = K / GROUP, mc = M - m0 < M_CHUNK ? M - m0 : M_CHUNK;
    for (int64_t b = s0; b < s1; b++) {
        const grouped_block blk = grouped_block_at(b, b1, BLOCK_ROWS, N, K, G, w, w_scale);
        if (m0 == 0)
            block_tile(0, mc, a, lda, w, w_scale, out, ldo, a_scale, K, blk.n, blk.nr, blk.pf_w, blk.pf_s, A32);
        else
            block_tile(0, mc, a + m0 * lda, lda, w, w_scale, out + m0 * ldo, ldo, a_scale + m0 * (A32 ? G : 1), K,
                       blk.n, blk.nr, NULL, NULL, A32);
    }
}

/* The transposed layout's rows (M > 4) against this thread's blocks [b0, b1), SUPER_BLOCKS at a time. */
static inline __attribute__((always_inline)) void transposed_pass(const int8_t *a, int64_t lda, const int8_t *w,
                                                                  const float *w_scale, float *out, int64_t ldo,
                                                                  const float *a_scale, int64_t M, int64_t N,
                                                                  int64_t K, int64_t b0, int64_t b1, const int A32) {
    for (int64_t s0 = b0; s0 < b1; s0 += SUPER_BLOCKS) {
        const int64_t s1 = s0 + SUPER_BLOCKS < b1 ? s0 + SUPER_BLOCKS : b1;
        for (int64_t m0 = 0; m0 < M; m0 += M_CHUNK)
            chunk_pass(a, lda, w, w_scale, out, ldo, a_scale, M, N, K, m0, s0, s1, b1, A32);
    }
}

/* transposed_pass of either contract. Not inlined: the pair layout's loop below then compiles as it does alone
   (inlined, it was 3% slower at 2 rows). */
static __attribute__((noinline)) void transposed_blocks(const int8_t *a, int64_t lda, const int8_t *w,
                                                        const float *w_scale, float *out, int64_t ldo,
                                                        const float *a_scale, int64_t M, int64_t N, int64_t K,
                                                        int64_t b0, int64_t b1, int a32) {
    if (a32) transposed_pass(a, lda, w, w_scale, out, ldo, a_scale, M, N, K, b0, b1, 1);
    else transposed_pass(a, lda, w, w_scale, out, ldo, a_scale, M, N, K, b0, b1, 0);
}

/* The GEMM of either contract (A32: a_scale f32[M, G], one scale per row and group; else f32[M]). */
static inline __attribute__((always_inline)) int grouped_avx2(const int8_t *a, int64_t lda, const int8_t *w,
                                                              const float *w_scale, float *out, int64_t ldo,
                                                              const float *a_scale, int64_t M, int64_t N, int64_t K,
                                                              int nthreads, const int A32) {
    if (M < 1 || K < GROUP || K % GROUP) return 1;
    int refuse = 0;
    for (int64_t m = 0; m < M; m++) {
        const int8_t *src = a + m * lda;
        for (int64_t k = 0; k < K; k++) refuse |= src[k] == -128;
    }
    if (refuse) return 1;
    /* the copy of rows whose stride aliases (without memory for it, the rows are read where they lie) */
    int8_t *copy = M > 4 && lda % ALIAS_STRIDE == 0 ? malloc((size_t)(M * (K + 64))) : NULL;
    if (copy) {
        for (int64_t m = 0; m < M; m++) memcpy(copy + m * (K + 64), a + m * lda, (size_t)K);
        a = copy;
        lda = K + 64;
    }
    const int64_t nb = (N + BLOCK_ROWS - 1) / BLOCK_ROWS, G = K / GROUP;
    #pragma omp parallel num_threads(nthreads)
    {
        int64_t b0, b1;
        grouped_thread_blocks(nb, &b0, &b1);
        if (M > 4) {
            transposed_blocks(a, lda, w, w_scale, out, ldo, a_scale, M, N, K, b0, b1, A32);
        } else {
            for (int64_t b = b0; b < b1; b++) {
                const grouped_block blk = grouped_block_at(b, b1, BLOCK_ROWS, N, K, G, w, w_scale);
                switch (M) { PAIRS_CASE(1) PAIRS_CASE(2) PAIRS_CASE(3) PAIRS_CASE(4) }
            }
        }
    }
    free(copy);
    return 0;
}

/* Returns 0 when done, 1 when nothing was computed (M < 1, K not a positive multiple of 32, an activation
   equal to -128). */
int w8a8_grouped_avx2(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out, int64_t ldo,
                      const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads) {
    return grouped_avx2(a, lda, w, w_scale, out, ldo, a_scale, M, N, K, nthreads, 0);
}

/* The group32 recipe's GEMM (salon.kernels.w8a8_group32): the same, with a_scale f32[M, K / 32] (contiguous), one
   scale per activation row and group, multiplied into the weights' scale of the group before the group's sum. */
int w8a8_group32_avx2(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out, int64_t ldo,
                      const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads) {
    return grouped_avx2(a, lda, w, w_scale, out, ldo, a_scale, M, N, K, nthreads, 1);
}
