/* W8A8 GEMV for decode and small batches (M <= GEMV_MAX_ROWS activation rows) on AVX2 CPUs:
 *
 *   out[m, n] = float32(acc[m, n]) * a_scale[m] * w_scale[n]     acc[m, n] = sum_k a[m, k] * w[n, k]  (exact)
 *
 * the same bits as the reference's dequantization (salon.kernels.w8a8_gemm.w8a8_epilogue: float(acc), times
 * a_scale, times w_scale, two float32 products in that order), so it can serve a step of any size next to
 * the large-M paths without changing a row's result.
 *
 * Memory-bound by design: at small M the time is the time to read w once. Each thread streams one
 * contiguous range of weight rows (the rows split evenly over the threads), GEMV_TILE_ROWS rows at a time,
 * with a software prefetch PREFETCH_BYTES ahead in the stream. A tile meets the activation rows
 * GEMV_PASS_ROWS at a time (their accumulators live in registers): the first pass reads the tile from
 * memory, the others from L1, so every weight byte is read from memory once per call. The activations
 * (M x Kp bytes, zero-padded to Kp, a multiple of 64) stay in L1 or L2. Each output element is one row's
 * exact sum, whatever M or the pass it falls in.
 *
 * The products: AVX2 has no int8 dot instruction that is exact on its own, so each 32-byte chunk is
 *
 *     u = |w|                       (vpabsb; -128 -> 128 read as unsigned, exact)
 *     s = sign(a, w) = a * sgn(w)   (vpsignb; a in [-127, 127] so -a never wraps)
 *     p = maddubs(u, s)             (u8 x s8 pairs summed to int16: |p| <= 2 * 128 * 127 = 32512 < 2^15,
 *                                    never saturates)
 *     acc += madd(p, 1)             (pairs of int16 summed to int32)
 *
 * u * s = |w| * a * sgn(w) = a * w, so every product is exact, and |acc| <= K * 128 * 127 < 2^31 for
 * K < 132,000. The one activation value this cannot take is -128 (its negation wraps): a call whose
 * activations hold one computes nothing and returns 1, and the caller takes another exact path
 * (per-token quantization clamps to [-127, 127], so the engine's activations never do).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GEMV_MAX_ROWS 128
/* Activation rows one pass over a weight row holds in registers; weight rows a tile (the passes after the
   first read it from L1). */
#define GEMV_PASS_ROWS 8
#define GEMV_TILE_ROWS 16
/* How far ahead of the row being read the stream is prefetched. */
#define PREFETCH_BYTES 2048

const int64_t salon_gemv_max_rows = GEMV_MAX_ROWS;

static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* acc += a . w over one 32-byte chunk (see the header for why it is exact). */
#define DOT32(acc, u, w, a)                                                                                 \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(a, w)), ones))

/* Rows [n0, n1) of out for exactly M activation rows (M a compile-time constant after inlining, so the
   accumulators live in registers). a: M rows of Kp bytes, zero past K. */
static inline __attribute__((always_inline)) void gemv_rows(const int M, const int8_t *a, int64_t Kp,
                                                            const int8_t *w, const int8_t *w_end, float *out,
                                                            int64_t ldo, const float *a_scale,
                                                            const float *w_scale, int64_t K, int64_t n0,
                                                            int64_t n1) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t k64 = K / 64 * 64;
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *wr = w + n * K;
        __m256i c[GEMV_PASS_ROWS];
        for (int m = 0; m < M; m++) c[m] = _mm256_setzero_si256();
        int64_t k = 0;
        for (; k < k64; k += 64) {
            _mm_prefetch((const char *)(wr + k + PREFETCH_BYTES), _MM_HINT_T0);
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wr + k));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wr + k + 32));
            const __m256i u0 = _mm256_abs_epi8(w0), u1 = _mm256_abs_epi8(w1);
            for (int m = 0; m < M; m++) {
                const int8_t *am = a + m * Kp + k;
                DOT32(c[m], u0, w0, _mm256_loadu_si256((const __m256i *)am));
                DOT32(c[m], u1, w1, _mm256_loadu_si256((const __m256i *)(am + 32)));
            }
        }
        for (; k < K; k += 32) {
            /* The chunk may run past the row: those bytes meet zero activations, so they add nothing; past
               the end of w they are not read at all (a zero-filled copy of the row's tail instead). */
            __m256i w0;
            if (wr + k + 32 <= w_end) {
                w0 = _mm256_loadu_si256((const __m256i *)(wr + k));
            } else {
                int8_t tmp[32] = {0};
                memcpy(tmp, wr + k, (size_t)(K - k));
                w0 = _mm256_loadu_si256((const __m256i *)tmp);
            }
            const __m256i u0 = _mm256_abs_epi8(w0);
            for (int m = 0; m < M; m++)
                DOT32(c[m], u0, w0, _mm256_loadu_si256((const __m256i *)(a + m * Kp + k)));
        }
        const float ws = w_scale[n];
        for (int m = 0; m < M; m++) out[m * ldo + n] = (float)hsum_epi32(c[m]) * a_scale[m] * ws;
    }
}

#define GEMV_CASE(MM)                                                                                        \
    case MM: gemv_rows(MM, a_pad + m0 * Kp, Kp, w, w_end, out + m0 * ldo, ldo, a_scale + m0, w_scale, K, t0, t1); \
        break;

/* a: int8[M, K] (row stride lda), w: int8[N, K] contiguous, out: float32[M, N] (row stride ldo).
   Returns 0 when done, 1 when nothing was computed (M out of [1, GEMV_MAX_ROWS], an activation equal to
   -128, or no memory for the padded activations). */
int w8a8_gemv_avx2(const int8_t *a, int64_t lda, const int8_t *w, float *out, int64_t ldo, const float *a_scale,
                   const float *w_scale, int64_t M, int64_t N, int64_t K, int nthreads) {
    if (M < 1 || M > GEMV_MAX_ROWS) return 1;
    const int64_t Kp = (K + 63) / 64 * 64;
    int8_t *a_pad = aligned_alloc(64, (size_t)(M * Kp > 0 ? M * Kp : 64));
    if (a_pad == NULL) return 1;
    int refuse = 0;
    for (int64_t m = 0; m < M && !refuse; m++) {
        const int8_t *src = a + m * lda;
        for (int64_t k = 0; k < K; k++) refuse |= src[k] == -128;
        memcpy(a_pad + m * Kp, src, (size_t)K);
        memset(a_pad + m * Kp + K, 0, (size_t)(Kp - K));
    }
    if (refuse) {
        free(a_pad);
        return 1;
    }
    const int8_t *w_end = w + N * K;
    #pragma omp parallel num_threads(nthreads)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t n0 = N * t / nt, n1 = N * (t + 1) / nt;
        for (int64_t t0 = n0; t0 < n1; t0 += GEMV_TILE_ROWS) {
            const int64_t t1 = t0 + GEMV_TILE_ROWS < n1 ? t0 + GEMV_TILE_ROWS : n1;
            for (int64_t m0 = 0; m0 < M; m0 += GEMV_PASS_ROWS) {
                switch (M - m0 < GEMV_PASS_ROWS ? M - m0 : GEMV_PASS_ROWS) {
                    GEMV_CASE(1) GEMV_CASE(2) GEMV_CASE(3) GEMV_CASE(4)
                    GEMV_CASE(5) GEMV_CASE(6) GEMV_CASE(7) GEMV_CASE(8)
                }
            }
        }
    }
    free(a_pad);
    return 0;
}
