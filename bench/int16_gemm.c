/* A probe of the recipe the engine does not run yet: one int16 term per activation instead of two int8
 * terms, as a group-scaled GEMM on AVX2 (bench.gemv --int16 times it against the engine's two-term GEMM on
 * the same weights; tests/bench/test_bench_int16_gemm.py checks its bits). Contract, as the engine's grouped
 * GEMM's with int16 activations:
 *
 *   acc_g[m, n] = sum_{k in [32g, 32g + 32)} a[m, k] * w[n, k]      (exact, int32: |acc_g| <= 32 * 32768 * 128)
 *   y = 0;  for g = 0 .. G-1:  y = y + float(acc_g) * w_scale[n, g]  (float() rounds to nearest even above 2^24;
 *                                                                     the product rounded, then the sum)
 *   out[m, n] = y * a_scale[m]
 *
 * a int16[M, K] (row stride lda), w int8[N, K] contiguous, w_scale float32[N, G], out float32[M, N] (row stride
 * ldo). Weight rows go in blocks of 8 over the threads, as in kernels/cpu/w8a8_grouped.c. Per block and group,
 * the 8 rows x 32 channels are transposed (16-bit units: a channel pair) and sign-extended into 16 vectors of
 * (8 rows x 2 channels) int16; each activation row meets them with a broadcast of its channel pair and one
 * vpmaddwd (16 products) + vpaddd, RB rows at a time sharing each weight vector. Nothing more is tuned (no
 * prefetch, no super blocks, no copy of aliasing rows, the block's rows' outputs kept in a buffer of M x 8):
 * what it gains over the engine's tuned two-term kernel is a floor for what the recipe gives.
 */
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RB 4

/* The 8 rows' 32 channels of group g as 16 vectors of (8 rows x 2 channels) int16. */
static void block_group(const int8_t *const rows[8], int64_t g, __m256i W[16]) {
    for (int h = 0; h < 2; h++) {
        __m128i x[8];
        for (int r = 0; r < 8; r++) x[r] = _mm_loadu_si128((const __m128i *)(rows[r] + g * 32 + h * 16));
        const __m128i t0 = _mm_unpacklo_epi16(x[0], x[1]), t1 = _mm_unpackhi_epi16(x[0], x[1]);
        const __m128i t2 = _mm_unpacklo_epi16(x[2], x[3]), t3 = _mm_unpackhi_epi16(x[2], x[3]);
        const __m128i t4 = _mm_unpacklo_epi16(x[4], x[5]), t5 = _mm_unpackhi_epi16(x[4], x[5]);
        const __m128i t6 = _mm_unpacklo_epi16(x[6], x[7]), t7 = _mm_unpackhi_epi16(x[6], x[7]);
        const __m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2);
        const __m128i u2 = _mm_unpacklo_epi32(t1, t3), u3 = _mm_unpackhi_epi32(t1, t3);
        const __m128i u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6);
        const __m128i u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
        const __m128i v[8] = {_mm_unpacklo_epi64(u0, u4), _mm_unpackhi_epi64(u0, u4), _mm_unpacklo_epi64(u1, u5),
                              _mm_unpackhi_epi64(u1, u5), _mm_unpacklo_epi64(u2, u6), _mm_unpackhi_epi64(u2, u6),
                              _mm_unpacklo_epi64(u3, u7), _mm_unpackhi_epi64(u3, u7)};
        for (int p = 0; p < 8; p++) W[h * 8 + p] = _mm256_cvtepi8_epi16(v[p]);
    }
}

/* Both lanes of a channel pair (a[k], a[k + 1]) in every 32-bit lane. */
static inline __m256i pair(const int16_t *a) {
    int32_t v;
    memcpy(&v, a, sizeof v);
    return _mm256_set1_epi32(v);
}

/* y[8] += float(acc) * scales (the product rounded, then the sum). */
static inline void add_scaled(float *y, __m256i acc, __m256 scales) {
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), _mm256_mul_ps(_mm256_cvtepi32_ps(acc), scales)));
}

/* Returns 0 when done, 1 when nothing was computed (M < 1, K not a positive multiple of 32, no memory). */
int w16a8_grouped_probe(const int16_t *a, int64_t lda, const int8_t *w, const float *w_scale, float *out,
                        int64_t ldo, const float *a_scale, int64_t M, int64_t N, int64_t K, int nthreads) {
    if (M < 1 || N < 1 || K < 32 || K % 32) return 1;
    const int64_t nb = (N + 7) / 8, G = K / 32;
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t b0 = nb * t / nt, b1 = nb * (t + 1) / nt;
        float *ybuf = malloc((size_t)(M * 8) * sizeof(float));
        if (!ybuf) {
            #pragma omp atomic write
            failed = 1;
        }
        for (int64_t b = b0; ybuf && b < b1; b++) {
            const int64_t n0 = b * 8;
            const int8_t *rows[8];
            const float *srow[8];
            for (int r = 0; r < 8; r++) {  /* a short last block's missing rows alias its first (never stored) */
                const int64_t n = n0 + r < N ? n0 + r : n0;
                rows[r] = w + n * K;
                srow[r] = w_scale + n * G;
            }
            memset(ybuf, 0, (size_t)(M * 8) * sizeof(float));
            for (int64_t g = 0; g < G; g++) {
                __m256i W[16];
                block_group(rows, g, W);
                const __m256 scales = _mm256_setr_ps(srow[0][g], srow[1][g], srow[2][g], srow[3][g], srow[4][g],
                                                     srow[5][g], srow[6][g], srow[7][g]);
                int64_t m = 0;
                for (; m + RB <= M; m += RB) {
                    const int16_t *ap[RB];
                    __m256i acc[RB];
                    for (int r = 0; r < RB; r++) {
                        ap[r] = a + (m + r) * lda + g * 32;
                        acc[r] = _mm256_setzero_si256();
                    }
                    for (int p = 0; p < 16; p++)
                        for (int r = 0; r < RB; r++)
                            acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(pair(ap[r] + 2 * p), W[p]));
                    for (int r = 0; r < RB; r++) add_scaled(ybuf + (m + r) * 8, acc[r], scales);
                }
                for (; m < M; m++) {
                    const int16_t *ap = a + m * lda + g * 32;
                    __m256i acc = _mm256_setzero_si256();
                    for (int p = 0; p < 16; p++) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pair(ap + 2 * p), W[p]));
                    add_scaled(ybuf + m * 8, acc, scales);
                }
            }
            for (int64_t m = 0; m < M; m++)
                for (int r = 0; r < 8 && n0 + r < N; r++) out[m * ldo + n0 + r] = ybuf[m * 8 + r] * a_scale[m];
        }
        free(ybuf);
    }
    return failed;
}
