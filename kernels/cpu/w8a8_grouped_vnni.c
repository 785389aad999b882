/* Group-scaled W8A8 GEMM on AVX-512 VNNI CPUs, bit-identical to kernels.w8a8_grouped.w8a8_grouped_scaled_ref
 * (and to the AVX2 kernel of w8a8_grouped.c):
 *
 *   acc_g[m, n] = sum_{k in [32g, 32g + 32)} a[m, k] * w[n, k]                   (exact, int32)
 *   y = 0;  for g = 0 .. G-1:  y = y + float(acc_g) * w_scale[n, g]   (the product rounded, then the sum)
 *   out[m, n] = y * a_scale[m]
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
 * next block while it reads one (packed: a few groups ahead in its one stream); a group's weights stay in registers while they meet the activation rows,
 * M_CHUNK at a time (one pass at decode sizes: every weight and scale byte is read from memory once per
 * call). Every output element sees the same operations in the same order whatever M, the chunking or the
 * thread split: a row's result never depends on the batch it sits in.
 */
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "grouped_blocks.h"

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define BLOCK_ROWS 16
/* Activation rows a group's weights meet per pass; their accumulators (4 KB) stay in L1. */
#define M_CHUNK 64
/* Activation-sum corrections kept on the stack up to this many (M x G) entries. */
#define STACK_CORRECTIONS 2048
/* A packed group: 8 x 64 bytes of weights (group_weights' t[0..7]), then the 16 rows' float32 scales; the packed
   tile prefetches the group this far ahead (without it, the packed layout lost to the rows' one from 12 rows on,
   where the products bind and the hardware prefetcher fell behind). */
#define PACKED_GROUP_BYTES (8 * 64 + BLOCK_ROWS * 4)
#define PACKED_PREFETCH (4 * PACKED_GROUP_BYTES)

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
   the group's correction, then the product rounded and the sum. */
VNNI static inline __attribute__((always_inline)) void group_rows(const int64_t mc, const int8_t *a, int64_t lda,
                                                                  const int32_t *corr, int64_t G, int64_t g,
                                                                  const __m512i *t, __m512 s, __m512 *y) {
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
        y[m] = _mm512_add_ps(y[m], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c0, c1)), s));
    }
}

/* out[m, n .. n + nr) = y[m] * a_scale[m] for the mc rows. */
VNNI static inline __attribute__((always_inline)) void store_rows(const int64_t mc, const __m512 *y, float *out,
                                                                  int64_t ldo, const float *a_scale, int64_t n,
                                                                  int nr) {
    const __mmask16 keep = (__mmask16)((1u << nr) - 1);
    for (int64_t m = 0; m < mc; m++)
        _mm512_mask_storeu_ps(out + m * ldo + n, keep, _mm512_mul_ps(y[m], _mm512_set1_ps(a_scale[m])));
}

/* Rows [n, n + nr) of out (nr <= 16) for activation rows [0, mc) of a (mc <= M_CHUNK; a compile-time constant
   up to 16 rows, decode with two activation terms per sequence, so the accumulators stay in registers).
   corr: -128 x each group's activation sum, [mc, G] (row stride G). pf_w, pf_s: the next block's weights and
   scales, prefetched while this one is read (NULL: none). */
VNNI static inline __attribute__((always_inline)) void block_tile(const int64_t mc, const int8_t *a, int64_t lda,
                                                                  const int32_t *corr, const int8_t *w,
                                                                  const float *w_scale, float *out, int64_t ldo,
                                                                  const float *a_scale, int64_t K, int64_t n, int nr,
                                                                  const int8_t *pf_w, const float *pf_s) {
    const int64_t G = K / GROUP;
    const int8_t *wrow[BLOCK_ROWS];
    const float *srow[BLOCK_ROWS];
    grouped_rows(wrow, srow, BLOCK_ROWS, n, nr, w, w_scale, K, G);
    __m512 y[M_CHUNK];
    for (int64_t m = 0; m < mc; m++) y[m] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < G; g0 += 8) {
        const int64_t ng = G - g0 < 8 ? G - g0 : 8;
        __m512 sc[8];
        group_scales(sc, srow, g0, ng);
        if (pf_s) grouped_prefetch_scales(pf_s, BLOCK_ROWS, g0, G);
        for (int64_t j = 0; j < ng; j++) {
            if (pf_w) grouped_prefetch_weights(pf_w, BLOCK_ROWS, g0 + j);
            __m512i t[8];
            group_weights(t, wrow, (g0 + j) * GROUP);
            group_rows(mc, a, lda, corr, G, g0 + j, t, sc[j], y);
        }
    }
    store_rows(mc, y, out, ldo, a_scale, n, nr);
}

/* The same for a block of the packed layout (w8a8_grouped_vnni_pack): its groups one after another, each
   group_weights' 8 vectors and then the 16 rows' scales, read in order -- one stream per thread, no transpose. */
VNNI static inline __attribute__((always_inline)) void packed_tile(const int64_t mc, const int8_t *a, int64_t lda,
                                                                   const int32_t *corr, const int8_t *pb, float *out,
                                                                   int64_t ldo, const float *a_scale, int64_t G,
                                                                   int64_t n, int nr) {
    __m512 y[M_CHUNK];
    for (int64_t m = 0; m < mc; m++) y[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int8_t *q = pb + g * PACKED_GROUP_BYTES;
        for (int i = 0; i < PACKED_GROUP_BYTES; i += 64)
            _mm_prefetch((const char *)q + PACKED_PREFETCH + i, _MM_HINT_T0);
        __m512i t[8];
        for (int i = 0; i < 8; i++) t[i] = _mm512_loadu_si512((const void *)(q + 64 * i));
        group_rows(mc, a, lda, corr, G, g, t, _mm512_loadu_ps((const float *)(q + 512)), y);
    }
    store_rows(mc, y, out, ldo, a_scale, n, nr);
}

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
        if (packed) packed_tile(MM, a, lda, corr, w + b * G * PACKED_GROUP_BYTES, out, ldo, a_scale, G, blk.n, blk.nr); \
        else block_tile(MM, a, lda, corr, w, w_scale, out, ldo, a_scale, K, blk.n, blk.nr, blk.pf_w, blk.pf_s); \
        break;

/* Returns 0 when done, 1 when nothing was computed (M < 1, K not a positive multiple of 32, no memory).
   w_scale NULL: w is the packed layout of w8a8_grouped_vnni_pack (the scales inside it). */
VNNI int w8a8_grouped_vnni(const int8_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out,
                           int64_t ldo, const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads) {
    if (M < 1 || K < GROUP || K % GROUP) return 1;
    const int64_t nb = (N + BLOCK_ROWS - 1) / BLOCK_ROWS, G = K / GROUP;
    int32_t stack_corr[STACK_CORRECTIONS];
    int32_t *corr = M * G <= STACK_CORRECTIONS ? stack_corr : malloc((size_t)(M * G) * sizeof(int32_t));
    if (corr == NULL) return 1;
    activation_corrections(corr, a, lda, M, G);
    const int packed = w_scale == NULL;
    #pragma omp parallel num_threads(nthreads)
    {
        int64_t b0, b1;
        grouped_thread_blocks(nb, &b0, &b1);
        for (int64_t b = b0; b < b1; b++) {
            const grouped_block blk = grouped_block_at(b, b1, BLOCK_ROWS, N, K, G, w, w_scale);
            switch (M) {
                DECODE_CASE(1) DECODE_CASE(2) DECODE_CASE(3) DECODE_CASE(4)
                DECODE_CASE(5) DECODE_CASE(6) DECODE_CASE(7) DECODE_CASE(8)
                DECODE_CASE(9) DECODE_CASE(10) DECODE_CASE(11) DECODE_CASE(12)
                DECODE_CASE(13) DECODE_CASE(14) DECODE_CASE(15) DECODE_CASE(16)
                default:
                    for (int64_t m0 = 0; m0 < M; m0 += M_CHUNK) {
                        const int64_t mc = M - m0 < M_CHUNK ? M - m0 : M_CHUNK;
                        if (packed) {
                            packed_tile(mc, a + m0 * lda, lda, corr + m0 * G, w + b * G * PACKED_GROUP_BYTES,
                                        out + m0 * ldo, ldo, a_scale + m0, G, blk.n, blk.nr);
                            continue;
                        }
                        block_tile(mc, a + m0 * lda, lda, corr + m0 * G, w, w_scale,
                                   out + m0 * ldo, ldo, a_scale + m0, K, blk.n, blk.nr, m0 ? NULL : blk.pf_w,
                                   m0 ? NULL : blk.pf_s);
                    }
            }
        }
    }
    if (corr != stack_corr) free(corr);
    return 0;
}

/* The packed layout of int8 w[N, K] and its scales f32[N, K / 32], for w8a8_grouped_vnni with w_scale NULL:
 * uint8 [nb = ceil(N / 16), G = K / 32, PACKED_GROUP_BYTES]. Block b's group g holds group_weights' 8 vectors
 * for rows 16b .. 16b + 15 (vector i, lane r: w[16b + r, 32g + 4i .. 32g + 4i + 3] XOR 0x80), then the 16 rows'
 * scales of group g. The missing rows of a short last block repeat its first row (computed, never stored), as
 * block_tile's do. packed: nb * G * PACKED_GROUP_BYTES bytes. Returns 0 when done, 1 when K is not a positive
 * multiple of 32 or N < 1. Each thread packs its own blocks. */
VNNI int w8a8_grouped_vnni_pack(const int8_t *w, const float *w_scale, int64_t N, int64_t K, int8_t *packed,
                                int nthreads) {
    if (N < 1 || K < GROUP || K % GROUP) return 1;
    const int64_t nb = (N + BLOCK_ROWS - 1) / BLOCK_ROWS, G = K / GROUP;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t n = b * BLOCK_ROWS;
        const int8_t *wrow[BLOCK_ROWS];
        const float *srow[BLOCK_ROWS];
        grouped_rows(wrow, srow, BLOCK_ROWS, n, N - n < BLOCK_ROWS ? (int)(N - n) : BLOCK_ROWS, w, w_scale, K, G);
        for (int64_t g = 0; g < G; g++) {
            int8_t *q = packed + (b * G + g) * PACKED_GROUP_BYTES;
            __m512i t[8];
            group_weights(t, wrow, g * GROUP);
            for (int i = 0; i < 8; i++) _mm512_storeu_si512((void *)(q + 64 * i), t[i]);
            float *sq = (float *)(q + 512);
            for (int r = 0; r < BLOCK_ROWS; r++) sq[r] = srow[r][g];
        }
    }
    return 0;
}

/* Bytes of w8a8_grouped_vnni_pack's layout for N x K weights. */
int64_t w8a8_grouped_vnni_packed_bytes(int64_t N, int64_t K) {
    return (N + BLOCK_ROWS - 1) / BLOCK_ROWS * (K / GROUP) * PACKED_GROUP_BYTES;
}
