/* Exact int32 accumulators of an int8 GEMM, out[m, n] = sum_k a[m, k] * w[n, k], on x86 CPUs.
 *
 * Two kernels, picked at run time by salon/kernels/cpu/w8a8_gemm.py from the CPU's flags (the file is compiled with
 * -mavx2; the VNNI kernel enables AVX-512 for itself only, so loading the library never needs AVX-512):
 *
 *   w8a8_acc_vnni  AVX-512 VNNI. _mm512_dpbusd_epi32 multiplies 64 unsigned x signed byte pairs and adds
 *                  them, four at a time, into 16 int32 lanes. Activations come as uint8 a + 128 (rows
 *                  padded to Kp, a multiple of 64, and to Mp rows, a multiple of 4); the result is made
 *                  signed again by subtracting 128 * sum_k w[n, k], summed by the same instruction against
 *                  a vector of ones. A block of 4 weight rows meets the activations 4 rows at a time
 *                  (16 accumulators); the weights are read from memory once per call, in the pass over
 *                  the first 4 activation rows, which also prefetches the blocks ahead.
 *   w8a8_acc_avx2  AVX2: activations widened to int16, _mm256_madd_epi16 on int16 pairs (|a*w| <= 127*127).
 *
 * Both are exact (|sum| <= K * 255 * 127 < 2^31 for K < 66,000): every output element depends only on its
 * own row and column, never on M, the blocking or the thread split.
 *
 * Not one algorithm at two widths (so not one header over two vector layers): the products come from other
 * instructions on other activation layouts (unsigned bytes with a correction term against int16 widened ahead
 * of the call), the blocks differ (4 weight rows x 4 activation rows against 1 x 4) and only the VNNI kernel
 * scales its outputs; what the two would share is the loop over k.
 */
#include <immintrin.h>
#include <stdint.h>

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

/* Bytes of weights prefetched ahead of the block being read. */
#define PREFETCH_BYTES 10240

VNNI static inline __m128i hsum4_512(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
    __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
    __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
    __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(u), _mm512_extracti64x4_epi64(u, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* x0..x3: 64 weights of each of the block's 4 rows at k (zeros past K). */
#define LOAD_W(LOAD)                                                                                          \
    __m512i x0 = LOAD(w0 + k), x1 = LOAD(w1 + k), x2 = LOAD(w2 + k), x3 = LOAD(w3 + k);
#define DP4(c0, c1, c2, c3, y)                                                                                \
    c0 = _mm512_dpbusd_epi32(c0, y, x0); c1 = _mm512_dpbusd_epi32(c1, y, x1);                                 \
    c2 = _mm512_dpbusd_epi32(c2, y, x2); c3 = _mm512_dpbusd_epi32(c3, y, x3);
#define DP16                                                                                                  \
    { __m512i y = _mm512_loadu_si512(a0 + k); DP4(c00, c01, c02, c03, y) }                                    \
    { __m512i y = _mm512_loadu_si512(a1 + k); DP4(c10, c11, c12, c13, y) }                                    \
    { __m512i y = _mm512_loadu_si512(a2 + k); DP4(c20, c21, c22, c23, y) }                                    \
    { __m512i y = _mm512_loadu_si512(a3 + k); DP4(c30, c31, c32, c33, y) }
#define LOAD_FULL(p) _mm512_loadu_si512(p)
#define LOAD_TAIL(p) _mm512_maskz_loadu_epi8(tail, p)
#define PREFETCH_W                                                                                            \
    _mm_prefetch((const char *)(w0 + pf + k), _MM_HINT_T0); _mm_prefetch((const char *)(w1 + pf + k), _MM_HINT_T0); \
    _mm_prefetch((const char *)(w2 + pf + k), _MM_HINT_T0); _mm_prefetch((const char *)(w3 + pf + k), _MM_HINT_T0);

/* Rows n .. n+nr-1 of the output (nr <= 4; missing rows alias row n and are not stored). With scales, the
   output is float32(acc) * a_scale[m] * w_scale[n] (two float32 products, in that order), else int32 acc. */
VNNI static void vnni_block(const uint8_t *a, const int8_t *w, void *out, const float *a_scale,
                            const float *w_scale, int64_t M, int64_t Mp, int64_t N, int64_t K, int64_t Kp, int64_t n,
                            int nr, int64_t pf) {
    const int8_t *w0 = w + n * K, *w1 = w0 + (nr > 1 ? K : 0), *w2 = w0 + (nr > 2 ? 2 * K : 0),
                 *w3 = w0 + (nr > 3 ? 3 * K : 0);
    const int64_t kfull = K / 64 * 64;
    const __mmask64 tail = K > kfull ? (~(__mmask64)0) >> (64 - (K - kfull)) : 0;
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    __m128i corr = _mm_setzero_si128();
    __m128 ws = _mm_setzero_ps();
    if (w_scale) {
        float t[4] = {0, 0, 0, 0};
        for (int j = 0; j < nr; j++) t[j] = w_scale[n + j];
        ws = _mm_loadu_ps(t);
    }
    for (int64_t m = 0; m < Mp; m += 4) {
        const uint8_t *a0 = a + m * Kp, *a1 = a0 + Kp, *a2 = a1 + Kp, *a3 = a2 + Kp;
        __m512i c00 = _mm512_setzero_si512(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00,
                c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00;
        int64_t k = 0;
        if (m == 0) {
            for (; k < kfull; k += 64) {
                PREFETCH_W
                LOAD_W(LOAD_FULL) DP4(s0, s1, s2, s3, ones) DP16
            }
            if (tail) { LOAD_W(LOAD_TAIL) DP4(s0, s1, s2, s3, ones) DP16 }
            corr = _mm_slli_epi32(hsum4_512(s0, s1, s2, s3), 7);
        } else {
            for (; k < kfull; k += 64) { LOAD_W(LOAD_FULL) DP16 }
            if (tail) { LOAD_W(LOAD_TAIL) DP16 }
        }
        __m128i r[4] = {hsum4_512(c00, c01, c02, c03), hsum4_512(c10, c11, c12, c13),
                        hsum4_512(c20, c21, c22, c23), hsum4_512(c30, c31, c32, c33)};
        for (int i = 0; i < 4 && m + i < M; i++) {
            __m128i v = _mm_sub_epi32(r[i], corr);
            int32_t t[4];
            if (a_scale) {
                __m128 f = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(v), _mm_set1_ps(a_scale[m + i])), ws);
                float *o = (float *)out + (m + i) * N + n;
                if (nr == 4) _mm_storeu_ps(o, f);
                else { _mm_storeu_si128((__m128i *)t, _mm_castps_si128(f)); for (int j = 0; j < nr; j++) o[j] = ((float *)t)[j]; }
            } else {
                int32_t *o = (int32_t *)out + (m + i) * N + n;
                if (nr == 4) _mm_storeu_si128((__m128i *)o, v);
                else { _mm_storeu_si128((__m128i *)t, v); for (int j = 0; j < nr; j++) o[j] = t[j]; }
            }
        }
    }
}

/* out: int32[M, N] when a_scale is NULL, else float32[M, N] dequantized (see vnni_block). */
VNNI void w8a8_acc_vnni(const uint8_t *a, const int8_t *w, void *out, const float *a_scale, const float *w_scale,
                        int64_t M, int64_t Mp, int64_t N, int64_t K, int64_t Kp, int nthreads) {
    const int64_t nb = (N + 3) / 4;
    const int64_t ahead = (PREFETCH_BYTES + 4 * K - 1) / (4 * K);
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t n = b * 4;
        int64_t pf = b + ahead < nb ? ahead * 4 * K : 0;
        vnni_block(a, w, out, a_scale, w_scale, M, Mp, N, K, Kp, n, N - n >= 4 ? 4 : (int)(N - n), pf);
    }
}

static inline int32_t hsum_256(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static inline __m256i load_w16(const int8_t *wr, int64_t k, int64_t K) {
    if (k + 16 <= K) return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wr + k)));
    int8_t tmp[16] = {0};
    for (int64_t i = 0; k + i < K && i < 16; i++) tmp[i] = wr[k + i];
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)tmp));
}

/* a: int16 with rows padded (zeros) to Kp >= K, Kp a multiple of 32; four activation rows share each load of w. */
void w8a8_acc_avx2(const int16_t *a, const int8_t *w, int32_t *out, int64_t M, int64_t N, int64_t K, int64_t Kp,
                   int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int8_t *wr = w + n * K;
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) {
            __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
            const int16_t *a0 = a + m * Kp, *a1 = a0 + Kp, *a2 = a1 + Kp, *a3 = a2 + Kp;
            for (int64_t k = 0; k < K; k += 16) {
                __m256i wv = load_w16(wr, k, K);
                c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)(a0 + k))));
                c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)(a1 + k))));
                c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)(a2 + k))));
                c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)(a3 + k))));
            }
            out[m * N + n] = hsum_256(c0); out[(m + 1) * N + n] = hsum_256(c1);
            out[(m + 2) * N + n] = hsum_256(c2); out[(m + 3) * N + n] = hsum_256(c3);
        }
        for (; m < M; m++) {
            __m256i c0 = _mm256_setzero_si256(), c1 = c0;
            const int16_t *a0 = a + m * Kp;
            int64_t k = 0;
            for (; k + 32 <= K; k += 32) {
                __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wr + k)));
                __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wr + k + 16)));
                c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)(a0 + k))));
                c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(a0 + k + 16))));
            }
            for (; k < K; k += 16)
                c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(load_w16(wr, k, K), _mm256_loadu_si256((const __m256i *)(a0 + k))));
            out[m * N + n] = hsum_256(_mm256_add_epi32(c0, c1));
        }
    }
}
